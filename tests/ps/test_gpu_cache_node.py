"""A ``storage: gpu_cache`` table on a PS node: refused clearly without a GPU,
served (pulls, updates, stats, metrics, checkpoints) with one."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from recstore import _native
from recstore.core import TableSpec
from recstore.ps.serve.server import start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, spec


def _cuda_ready() -> bool:
    return bool(
        torch.cuda.is_available() and _native.built_with_cuda() and _native.cuda_available()
    )


def gpu_cache_spec(name: str = "cached") -> TableSpec:
    return spec(name, storage="gpu_cache", gpu_cache={"rows": 64, "ways": 4})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_node_without_a_gpu_refuses_the_tier(tmp_path: Path, device: str) -> None:
    if device == "cuda" and _cuda_ready():
        pytest.skip("this machine has a GPU")
    handle = start_in_thread(data_dir=tmp_path, device=device)
    client = Client(handle.address)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            client.create(gpu_cache_spec())
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "storage: gpu_cache" in str(refused.value.details())
        assert client.names() == []
    finally:
        client.close()
        handle.stop(final_checkpoint=False)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA device")
def test_a_gpu_node_serves_the_tier_end_to_end(tmp_path: Path) -> None:
    handle = start_in_thread(data_dir=tmp_path, device="cuda", metrics_port=0)
    client = Client(handle.address)
    try:
        client.create(gpu_cache_spec())
        client.create(spec("plain"))
        keys = np.arange(0, 200, 2)
        for name in ("cached", "plain"):
            client.pull(name, keys)
            client.update(name, keys, np.ones((len(keys), 8), np.float32), lr=0.5)
        assert np.array_equal(client.pull("cached", keys), client.pull("plain", keys))
        stats = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="cached"))
        assert stats.engine["cache_hits"] > 0
        assert stats.engine["cache_capacity_rows"] == 64
        url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as reply:
            body = reply.read().decode()
        assert 'recstore_ps_table_cache_hits_total{table="cached"}' in body
        client.save("one")
    finally:
        client.close()
        handle.stop(final_checkpoint=False)


class _Hosted:
    """What the node's table collector reads of a hosted table: its ``table``."""

    def __init__(self, table: object) -> None:
        self.table = table


def test_cache_stats_become_table_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from recstore.ps.serve.metrics import CACHE_METRICS, _TableCollector
    from recstore.store.options import native_cache_options, native_options

    table_spec = gpu_cache_spec()
    twin = _native.CacheTable(
        native_options(table_spec, 0, 1, _native), native_cache_options(table_spec, 0, 1, _native)
    )
    keys = np.array([1, 2, 1], dtype=np.int64)
    twin.pull(keys, np.empty((3, 8), np.float32))
    twin.pull(keys, np.empty((3, 8), np.float32))
    registry = CollectorRegistry()
    hosted = {
        "cached": _Hosted(twin),
        "plain": _Hosted(_native.Table(native_options(spec(), 0, 1, _native))),
    }
    registry.register(_TableCollector(lambda: hosted, dict))  # type: ignore[arg-type]
    body = generate_latest(registry).decode()
    assert 'recstore_ps_table_cache_hits_total{table="cached"} 3.0' in body
    assert 'recstore_ps_table_cache_misses_total{table="cached"} 3.0' in body
    assert 'recstore_ps_table_cache_hit_rate{table="cached"} 0.5' in body
    assert 'recstore_ps_table_cache_resident_rows{table="cached"} 2.0' in body
    for key in CACHE_METRICS:
        assert f'{key}{{table="plain"}}' not in body and f'{key}_total{{table="plain"}}' not in body
