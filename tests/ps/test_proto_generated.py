"""The committed generated code matches proto/recstore/v1/ps.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_package_imports() -> None:
    from recstore.v1 import ps_pb2, ps_pb2_grpc

    assert ps_pb2.DESCRIPTOR.package == "recstore.v1"
    assert hasattr(ps_pb2_grpc, "ParameterServerStub")
    # field numbers are the wire contract: the codec in recstore.core.wire relies on them
    fields = {f.name: f.number for f in ps_pb2.PullRequest.DESCRIPTOR.fields}
    assert fields == {"table": 1, "epoch": 2, "keys": 3, "read_only": 4, "value_dtype": 5}


def test_generated_field_tables_match_the_descriptor() -> None:
    from recstore.core import ps_fields
    from recstore.v1 import ps_pb2

    for name, message in ps_pb2.DESCRIPTOR.message_types_by_name.items():
        numbers = {f.name: f.number for f in message.fields}
        assert {k: v for k, v in vars(getattr(ps_fields, name)).items() if k in numbers} == numbers
        assert {n: f for n, (f, _) in ps_fields.SCHEMAS[name].items()} == {
            v: k for k, v in numbers.items()
        }
