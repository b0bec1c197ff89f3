#!/usr/bin/env bash
# GPU check, run from anywhere on a machine with an NVIDIA GPU and nvcc (no
# network needed): builds recstore._native with the CUDA kernels, runs the CUDA
# tests against the CPU engine (tests marked gpu: the CUDA table and the gpu_cache
# tier), then the GPU benchmark (store figures and gpu_cache lookups/s).
# Logs, the JUnit report and the benchmark JSON go to $OUT when set, else to
# bench/results/. Wheels under .whl/ (scripts/gpu_wheels.sh fetches them) are
# installed into a private folder first, for what the machine's Python lacks
# (pydantic for recstore.core). Takes about 4-6 minutes on an H200 machine.
# GPU_CHECK_MODULE=path/_native....so skips the build and tests that module (each
# run leaves the module it built beside the results).
# Exit status: 0 when the build, the tests and the benchmark all succeeded.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
RESULTS=${OUT:-$ROOT/bench/results}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1

stage() { echo; echo "== $* ($(date -u +%T))"; }

WORK=$(mktemp -d /tmp/recstore-gpu-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

build_module() {
  local work=$1
  stage "building recstore._native with CUDA"
  local nvcc
  nvcc=$(command -v nvcc || true)
  if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
  if [ -z "$nvcc" ]; then echo "gpu_check: no nvcc on PATH or in /usr/local/cuda/bin"; return 1; fi
  "$nvcc" --version | tail -2
  local generator=()
  if command -v ninja >/dev/null; then generator=(-G Ninja); fi
  timeout 120 cmake -S "$ROOT" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DRECSTORE_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DPython_EXECUTABLE="$(command -v "$PY")"
  timeout 420 cmake --build "$work/build" -j "$(nproc)"
}

main() {
  local work=$WORK status=0
  echo "== gpu_check $(date -u +%FT%TZ) in $ROOT, results in $RESULTS"

  stage "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  # The build needs Python.h (FindPython Development.Module) and nanobind.
  "$PY" -c "import os, sysconfig, nanobind; h = sysconfig.get_paths()['include']; print('Python.h:', h, os.path.exists(os.path.join(h, 'Python.h')), '| nanobind', nanobind.__version__)"

  local site="$work/site"
  if compgen -G ".whl/*.whl" >/dev/null; then
    stage "installing .whl/ into $site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" .whl/*.whl
  fi

  local module=${GPU_CHECK_MODULE:-}
  if [ -n "$module" ]; then
    stage "using the module built earlier: $module"
  else
    build_module "$work"
    module=$(ls "$work"/build/_native*.so)
    # kept beside the results, so that a rerun with only Python changes can skip the build
    cp "$module" "$RESULTS/"
  fi

  # The package as the tests import it: src/recstore with the component links
  # resolved and the fresh module beside its Python files.
  # cp -L follows the links (shutil.copytree tests a relative link's target
  # against the working directory and would drop them as dangling).
  mkdir -p "$work/pkg"
  cp -RL src/recstore "$work/pkg/recstore"
  find "$work/pkg/recstore" \( -name __pycache__ -prune -o -name '*.so' \) -exec rm -rf {} +
  cp "$module" "$work/pkg/recstore/"
  export PYTHONPATH="$work/pkg:$site${PYTHONPATH:+:$PYTHONPATH}"
  RECSTORE_PKG="$work/pkg" "$PY" - <<'PYCHECK'
import os
from recstore import _native
print("module:", _native.__file__)
assert _native.__file__.startswith(os.environ["RECSTORE_PKG"]), (
    "an installed recstore shadows the fresh build: run in a Python without recstore installed"
)
print("built_with_cuda:", _native.built_with_cuda(), "devices:", _native.cuda_device_count())
assert _native.built_with_cuda(), "the module was built without CUDA"
assert _native.cuda_available(), "the module sees no CUDA device"
print("device 0:", _native.cuda_device_name(0))
PYCHECK

  stage "CUDA tests against the CPU engine"
  # tests/store: CudaTable and the gpu_cache tier against their CPU twins; the
  # node test serves a gpu_cache table over gRPC where the node's packages exist;
  # the NVE Hierarchical layer's GPU cache against its CPU run (needs the SDK's).
  local node_tests=()
  if "$PY" -c "import grpc, prometheus_client" 2>/dev/null; then
    node_tests=(tests/ps/test_gpu_cache_node.py tests/client/test_gpu_cache_local.py
      tests/client/test_device_cache_gpu.py tests/client/test_grpc_sharding.py
      tests/client/test_nve_gpu_layers.py)
  else
    echo "gpu_check: grpc or prometheus_client missing: the gpu_cache node test is left out"
  fi
  timeout 300 "$PY" -m pytest -m gpu tests/store ${node_tests[@]+"${node_tests[@]}"} \
    -p no:cacheprovider -q -rfE --timeout 120 \
    --continue-on-collection-errors \
    --junitxml "$RESULTS/gpu_tests.xml" || status=$?
  timeout 60 "$PY" -m pytest tests/store/test_cuda_build.py -p no:cacheprovider -q || status=$?
  if [ ${#node_tests[@]} -gt 0 ]; then
    stage "the NVE layer tests, whole, where a GPU is the default device, and its sample"
    timeout 120 "$PY" -m pytest tests/client/test_nve.py -p no:cacheprovider -q -rfE \
      "tests/client/test_examples.py::test_nve_inference_sample_runs_with_the_reference_arguments" \
      --timeout 60 || status=$?
  fi

  stage "GPU benchmark"
  # shellcheck disable=SC2086  # GPU_BENCH_ARGS holds several flags
  timeout 300 "$PY" bench/gpu_store_bench.py --out "$RESULTS/gpu_store_bench.json" \
    ${GPU_BENCH_ARGS:-} || status=$?

  stage "done: exit status $status"
  return "$status"
}

main 2>&1 | tee "$RESULTS/gpu_check.log"
exit "${PIPESTATUS[0]}"
