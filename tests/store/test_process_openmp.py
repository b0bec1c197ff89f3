"""Batch work on torch's OpenMP threads (``_native.share_process_openmp``).

A training process's torch leaves its OpenMP threads spinning after each
parallel kernel, on the cores the engine's own helpers need; shared, the
engine hands its batch work to that team instead. Sharing must only ever use a
libgomp the process loaded already, give the same bits as the engine's own
pool, leave a forked child working (its team's threads are gone), and be what
the local backend sets up.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from recstore import _native
from recstore.client import RecStoreClient
from recstore.core import TableSpec
from recstore.store import Table

ROWS, DIM, IDS, BAG = 50_000, 32, 200_000, 4


@pytest.fixture
def restored() -> Iterator[None]:
    """Whatever a test sets, the process's sharing and thread count are put back."""
    shared, threads = _native.shares_process_openmp(), _native.num_threads()
    yield
    _native.share_process_openmp(shared)
    _native.set_num_threads(threads)


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_without_a_loaded_libgomp_nothing_is_shared() -> None:
    out = _run(
        "import sys\n"
        "from recstore import _native\n"
        "assert 'torch' not in sys.modules\n"
        "print(_native.share_process_openmp(True), _native.shares_process_openmp())\n"
    )
    assert out == "False False"


def _trained(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A table's rows after pooled bags, their update and a plain update, big enough that
    every call splits its work over the threads."""
    spec = TableSpec(
        name="shared",
        num_embeddings=ROWS,
        embedding_dim=DIM,
        initializer={"kind": "uniform", "low": -1.0, "high": 1.0, "seed": 5},
        optimizer={"kind": kind, "lr": 0.05},
    )
    table = Table(spec)
    rng = np.random.default_rng(9)
    ids = torch.from_numpy(rng.zipf(1.1, IDS) % ROWS)
    pooled = table.pool(ids, BAG)
    grads = torch.from_numpy(rng.normal(0, 1, (IDS // BAG, DIM)).astype(np.float32))
    table.update_bags(ids, BAG, grads)
    table.update(ids.numpy(), rng.normal(0, 1, (IDS, DIM)).astype(np.float32))
    return pooled.numpy().copy(), table.pull(np.arange(ROWS, dtype=np.int64)).copy()


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad", "adam"])
def test_shared_threads_give_the_same_bits_as_the_pool(kind: str, restored: None) -> None:
    _native.set_num_threads(2)
    assert _native.share_process_openmp(False) is False
    own = _trained(kind)
    assert _native.share_process_openmp(True) is True  # torch's libgomp is loaded here
    assert _native.shares_process_openmp()
    shared = _trained(kind)
    for a, b in zip(own, shared, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_child_forked_after_sharing_works_on_the_pool() -> None:
    out = _run(
        "import os, numpy as np, torch\n"
        "from recstore import _native\n"
        "from recstore.core import TableSpec\n"
        "from recstore.store import Table\n"
        "_native.set_num_threads(2)\n"
        "assert _native.share_process_openmp(True)\n"
        "t = Table(TableSpec(name='f', num_embeddings=1000, embedding_dim=8))\n"
        "keys = np.arange(200_000, dtype=np.int64) % 1000\n"
        "t.pull(keys)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = not _native.shares_process_openmp() and t.pull(keys).shape == (200_000, 8)\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status), _native.shares_process_openmp())\n"
    )
    assert out == "0 True"


def test_the_local_backend_shares_torch_threads(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _native.share_process_openmp(False)
    from recstore.client.backends import local

    monkeypatch.setattr(local, "_store", None)  # as in a process's first local client
    client = RecStoreClient(role="openmp")
    client.set_ps_backend("local")
    client.init_data("openmp_t", (10, 4), torch.float32)
    try:
        assert _native.shares_process_openmp()
    finally:
        client.delete_data("openmp_t")
        client.close()


def test_the_grpc_backend_shares_torch_threads(restored: None) -> None:
    """A trainer over gRPC runs the engine's work there too (request encoding, pooling)."""
    client = RecStoreClient(role="openmp-grpc")  # (its default backend may share already)
    try:
        _native.share_process_openmp(False)
        client.set_ps_endpoints(["127.0.0.1:9"])  # the backend is made; nothing is called
        assert _native.shares_process_openmp()
    finally:
        client.close()
