"""The gpu_cache tier on a GPU against its CPU twin (the oracle) on the same calls.

Both twins share the directory functions (csrc/cache_sets.h) and the host
engine, so after the same calls they must hold the same keys in the same slots
with the same ticks and counters, return the same rows bit for bit, and leave
the same host rows and optimizer state. The CUDA twin gets torch CUDA tensors
and numpy arrays in turn (device buffers used in place, host ones staged).
Runs only where a CUDA device is visible (scripts/gpu_check.sh).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from recstore import _native
from recstore.core import TableSpec
from recstore.store import Table
from recstore.store.buffers import NUMPY_DTYPES
from recstore.store.options import native_cache_options, native_options

from .cuda_device import CUDA_ONLY, to_raw
from .test_gpu_cache import OPTIMIZERS, assert_same_tables, keys_of, rows, spec_of

pytestmark = CUDA_ONLY


def twins(spec: TableSpec) -> tuple[Any, Any]:
    options = native_options(spec, 0, 1, _native)
    cache = native_cache_options(spec, 0, 1, _native)
    return _native.CacheTable(options, cache), _native.CudaCacheTable(options, cache, 0)


def on_gpu(a: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(a.view(np.int16) if a.dtype == np.uint16 else a)
    t = t.view(torch.bfloat16) if a.dtype == np.uint16 else t
    return t.cuda()


def assert_same_cache(cpu: Any, gpu: Any) -> None:
    (ck, ct), (gk, gt) = cpu.directory(), gpu.directory()
    assert np.array_equal(ct, gt)
    live = ct != 0
    assert np.array_equal(ck[live], gk[live])
    assert np.array_equal(
        cpu.cached_rows().reshape(len(ct), -1)[live], gpu.cached_rows().reshape(len(gt), -1)[live]
    )
    assert cpu.cache_stats() == gpu.cache_stats()


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_cuda_tier_matches_its_cpu_twin(optimizer: str, dtype: str) -> None:
    spec = spec_of(
        dtype=dtype,
        num_embeddings=2000,
        optimizer={"kind": optimizer, "lr": 0.05},
        gpu_cache={"rows": 96, "ways": 8},
    )
    cpu, gpu = twins(spec)
    rng = np.random.default_rng(5)
    for step in range(30):
        ids = keys_of(rng, 256, 120, spec.num_embeddings)
        want = rows(spec, len(ids))
        cpu.pull(ids, want)
        if step % 2:
            got = raw_out = rows(spec, len(ids))
            gpu.pull(ids, raw_out)
        else:
            out = torch.empty(
                (len(ids), spec.embedding_dim), device="cuda", dtype=getattr(torch, dtype)
            )
            gpu.pull(torch.from_numpy(ids).cuda(), out)
            got = to_raw(out)
        assert np.array_equal(got, want), f"step {step}"
        grads = rng.standard_normal((len(ids), spec.embedding_dim)).astype(np.float32)
        cpu.update(ids, grads, 0.05)
        if step % 2:
            gpu.update(ids, grads, 0.05)
        else:
            gpu.update(torch.from_numpy(ids).cuda(), torch.from_numpy(grads).cuda(), 0.05)
        if step % 9 == 4:
            gone = ids[:7].copy()
            assert cpu.erase(gone) == gpu.erase(gone)
        torch.cuda.synchronize()
        assert_same_cache(cpu, gpu)
    assert_same_tables(spec, cpu, gpu)
    assert gpu.cache_stats()["cache_evictions"] > 0


def test_a_refused_pull_leaves_the_gpu_cache_as_it_was() -> None:
    spec = spec_of(gpu_cache={"rows": 16, "ways": 4})
    _, gpu = twins(spec)
    gpu.pull(np.arange(10, dtype=np.int64), rows(spec, 10))
    before = (gpu.directory(), gpu.cache_stats())
    with pytest.raises(ValueError):
        gpu.pull(np.array([1, spec.num_embeddings], dtype=np.int64), rows(spec, 2))
    after = (gpu.directory(), gpu.cache_stats())
    assert np.array_equal(before[0][1], after[0][1]) and before[1] == after[1]


def test_the_facade_serves_a_gpu_cache_table_and_reports_its_cache() -> None:
    spec = spec_of(gpu_cache={"rows": 64})
    table = Table(spec, device="cuda")
    keys = torch.arange(0, 100, device="cuda")
    first = table.pull(keys)
    again = table.pull(keys)
    assert first.is_cuda and torch.equal(first, again)
    table.update(keys, torch.ones_like(first), lr=0.1)
    moved = table.pull(keys)
    assert torch.allclose(moved, first - 0.1)
    stats = table.stats()
    assert stats["cache_hits"] > 0 and stats["cache_capacity_rows"] == 64
    host = Table(spec.model_copy(update={"storage": "host", "gpu_cache": None}))
    host_keys = keys.cpu().numpy()
    host.pull(host_keys)
    host.update(
        host_keys, np.ones((100, spec.embedding_dim), dtype=NUMPY_DTYPES[spec.dtype]), lr=0.1
    )
    assert np.array_equal(host.pull(host_keys), moved.cpu().numpy())
