"""Generate the Python gRPC code of the wire contract (proto/ -> src/recstore/v1/).

The generated files are committed so that installing RecStore needs no protoc;
``--check`` regenerates into a scratch directory and fails when the committed
files differ (a test runs it, so a stale checkout cannot pass CI).

Usage: python scripts/gen_proto.py [--check]
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "src"
PROTOS = ["recstore/v1/ps.proto"]
GENERATED = ["ps_pb2.py", "ps_pb2.pyi", "ps_pb2_grpc.py"]
PACKAGE_DIR = Path("recstore") / "v1"
INIT_TEXT = '"""Generated gRPC code of proto/recstore/v1 (scripts/gen_proto.py)."""\n'


def generate(out_root: Path) -> None:
    """Run protoc (from grpcio-tools) for every proto into ``out_root``."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    (out_root / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    (out_root / PACKAGE_DIR / "__init__.py").write_text(INIT_TEXT)


def stale_files() -> list[str]:
    """Generated files whose committed copy differs from a fresh generation."""
    with tempfile.TemporaryDirectory() as scratch:
        generate(Path(scratch))
        stale = []
        for name in [*GENERATED, "__init__.py"]:
            fresh = Path(scratch) / PACKAGE_DIR / name
            committed = OUT_ROOT / PACKAGE_DIR / name
            if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                stale.append(str(PACKAGE_DIR / name))
        return stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when generated code is stale")
    options = parser.parse_args()
    if options.check:
        stale = stale_files()
        if stale:
            print("stale generated code, run scripts/gen_proto.py:", *stale, sep="\n  ")
            return 1
        print("generated code is up to date")
        return 0
    generate(OUT_ROOT)
    print(f"generated {', '.join(GENERATED)} in {OUT_ROOT / PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
