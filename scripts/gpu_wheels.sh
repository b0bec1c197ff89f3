#!/usr/bin/env bash
# Downloads into .whl/ the wheels scripts/gpu_check.sh installs on a GPU machine
# that has no network: what recstore.core needs beyond that machine's image
# (pydantic and its dependencies), for CPython 3.12 on x86-64 Linux, at the
# versions of this checkout's .venv when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(pydantic pydantic-core annotated-types typing-inspection typing-extensions
  protobuf grpcio grpcio-health-checking grpcio-reflection)
VENV_PY=.venv/bin/python
specs=()
for name in "${PACKAGES[@]}"; do
  version=""
  if [ -x "$VENV_PY" ]; then
    version=$("$VENV_PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name")
  fi
  specs+=("${name}${version:+==$version}")
done

rm -rf .whl
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 \
  -d .whl "${specs[@]}"
ls -1 .whl
