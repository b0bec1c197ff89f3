"""Generated gRPC code of proto/recstore/v1 (scripts/gen_proto.py)."""
