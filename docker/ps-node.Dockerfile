# syntax=docker/dockerfile:1
# recstore-ps: the parameter-server node. The native engine is compiled with its CUDA kernels
# in a CUDA devel stage; the image that runs ships only the NVIDIA CUDA runtime base, the
# virtual environment and a non-root user. The operator starts it as
#   recstore ps-node --port 50051 --metrics-port 9100 --data-dir /data --shard-index I ...
# Build from the repository root: docker build -f docker/ps-node.Dockerfile -t recstore-ps .
ARG CUDA_VERSION=13.0.1
ARG UBUNTU_VERSION=24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS builder
# Hopper by default (sm_90 code + PTX for newer GPUs); override for other fleets.
ARG CUDA_ARCHITECTURES="90-real;90-virtual"
# torch matching the CUDA runtime (the engine exchanges CUDA tensors with torch via DLPack).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-dev python3-venv build-essential cmake ninja-build \
      libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Every version from the lock (requirements/lock.txt); torch at the locked release
# in the build TORCH_VARIANT names (only its own index has it), the rest as locked.
ARG TORCH_VARIANT=cu130
COPY requirements/lock.txt /tmp/lock.txt
RUN grep -v '^torch==' /tmp/lock.txt > /tmp/constraints.txt \
 && pip install -c /tmp/constraints.txt --extra-index-url "${TORCH_INDEX_URL}" \
      "torch==$(sed -n 's/^torch==\([^+]*\).*/\1/p' /tmp/lock.txt)+${TORCH_VARIANT}"
ENV PIP_CONSTRAINT=/tmp/constraints.txt
WORKDIR /src
COPY pyproject.toml CMakeLists.txt README.md ./
COPY cmake/ cmake/
COPY csrc/ csrc/
COPY src/ src/
COPY client_sdk/ client_sdk/
COPY ps_node/ ps_node/
COPY admin_api/ admin_api/
COPY operator/ operator/
# RECSTORE_CUDA=ON fails the build instead of silently producing a CPU-only engine.
ENV RECSTORE_CUDA=ON
RUN pip wheel --no-deps --wheel-dir /wheels \
      --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" . \
 && pip install "$(ls /wheels/recstore-*.whl)[ps,cli]" \
 && python -c "import recstore._native as n; assert n.built_with_cuda(), 'no CUDA kernels'"

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
LABEL org.opencontainers.image.title="recstore-ps" \
      org.opencontainers.image.description="RecStore parameter-server node (CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The gRPC C++ runtime the native module links, named by the dev package's dependency
# (libgrpc++1.51 on Debian 12, libgrpc++1.51t64 on Debian 13 and Ubuntu 24.04).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
      "$(apt-cache depends libgrpc++-dev | sed -n 's/^ *Depends: \(libgrpc++[0-9].*\)/\1/p')" \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 recstore \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin recstore \
 && mkdir -p /data \
 && chown 10001:10001 /data
COPY --from=builder /opt/venv /opt/venv
USER 10001:10001
WORKDIR /data
# gRPC (pull/push/update, health) and Prometheus /metrics.
EXPOSE 50051 9100
ENTRYPOINT ["recstore"]
CMD ["ps-node", "--port", "50051", "--metrics-port", "9100", "--data-dir", "/data", "--host", "0.0.0.0"]
