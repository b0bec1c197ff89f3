# syntax=docker/dockerfile:1
# recstore-operator: the kopf operator for EmbeddingTable resources. CPU only, slim base,
# non-root. The chart runs it as `recstore operator --standalone --all-namespaces
# --liveness=http://0.0.0.0:8080/healthz` (or one --namespace=NS per watched namespace).
# Build from the repository root: docker build -f docker/operator.Dockerfile -t recstore-operator .
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS builder
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake ninja-build \
      libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Every version from the lock (requirements/lock.txt); torch at the locked release
# in the build TORCH_VARIANT names (only its own index has it), the rest as locked.
ARG TORCH_VARIANT=cpu
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
ENV RECSTORE_CUDA=OFF
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && pip install "$(ls /wheels/recstore-*.whl)[operator,cli]"

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="recstore-operator" \
      org.opencontainers.image.description="RecStore Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The gRPC C++ runtime the native module links, named by the dev package's dependency
# (libgrpc++1.51 on Debian 12, libgrpc++1.51t64 on Debian 13 and Ubuntu 24.04).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      "$(apt-cache depends libgrpc++-dev | sed -n 's/^ *Depends: \(libgrpc++[0-9].*\)/\1/p')" \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 recstore \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin recstore
COPY --from=builder /opt/venv /opt/venv
USER 10001:10001
WORKDIR /tmp
# kopf's liveness endpoint (/healthz).
EXPOSE 8080
ENTRYPOINT ["recstore"]
CMD ["operator", "--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]
