"""A layer's caches (host tier, GPU tier) report their counters to the table's nodes, whose
table view shows them."""

from __future__ import annotations

import logging

import pytest
import torch

import recstore.nve as nve
from recstore.client import RecStoreClient
from recstore.client.nve import layers
from recstore.client.nve.cache_report import CacheReporter, client_name
from recstore.core.control import ControlClient

from .conftest import unique_name

ROWS, DIM = 1000, 8


def _layer(client: RecStoreClient, name: str, **config: object) -> nve.NVEmbedding:
    return nve.NVEmbedding(
        ROWS, DIM, torch.float32, nve.LayerType.Hierarchical,
        storage=nve.RemoteTable(client, name), optimize_for_training=False,
        config={"host_cache_size": 1 << 16, **config}, device="cpu",
    )  # fmt: skip


def _node_views(endpoints: list[str], name: str) -> list[dict[tuple[str, str, str], object]]:
    """Per node, its table view's client caches by (client, layer, tier)."""
    views = []
    for endpoint in endpoints:
        with ControlClient(endpoint) as control:
            stats = control.stats(name)
        views.append({c.key: c for c in stats.client_caches})
    return views


def test_every_node_of_the_table_shows_the_layers_cache(
    grpc_client: RecStoreClient, ps_endpoints: list[str]
) -> None:
    name = unique_name()
    layer = _layer(grpc_client, name, cache_report_interval=0)  # only when asked
    keys = torch.tensor([1, 2, 999, 2])
    layer(keys)
    layer(keys)
    assert _node_views(ps_endpoints, name) == [{}, {}]  # nothing sent on its own
    layer.report_cache_stats()
    mine = (client_name(grpc_client.role), layer.name, "host")
    stats = layer.cache_stats()
    for view in _node_views(ps_endpoints, name):
        cache = view[mine]
        assert cache.policy == "lfu"  # type: ignore[attr-defined]
        figures = cache.figures  # type: ignore[attr-defined]
        assert (figures.hits, figures.misses) == (stats["hits"], stats["misses"]) == (3, 3)
        assert figures.resident_rows == stats["resident_rows"] == 3
        assert figures.resident_bytes == stats["bytes_used"]
        assert figures.capacity_bytes == stats["capacity_bytes"]
        assert figures.hit_rate == pytest.approx(0.5)
        assert cache.reported_unix > 0  # type: ignore[attr-defined]


def test_a_layers_gpu_tier_reports_beside_its_host_tier_to_every_node(
    grpc_client: RecStoreClient, ps_endpoints: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the GPU tier on CPU tensors (the same torch code as on a GPU): the CUDA device rule
    # is resolve_device's, tested in test_nve.py
    monkeypatch.setattr(layers, "resolve_device", lambda *_: torch.device("cpu"))
    name = unique_name()
    layer = nve.NVEmbedding(
        ROWS, DIM, torch.float32, nve.LayerType.Hierarchical, gpu_cache_size=1 << 14,
        storage=nve.RemoteTable(grpc_client, name), optimize_for_training=False,
        config={"host_cache_size": 1 << 16, "cache_report_interval": 0},
    )  # fmt: skip
    keys = torch.tensor([1, 2, 999, 2])
    for _ in range(3):
        layer(keys)
    layer.report_cache_stats()
    host = layer.cache_stats()
    gpu = host["gpu"]
    assert isinstance(gpu, dict) and (gpu["tier"], host["tier"]) == ("gpu", "host")
    assert (gpu["hits"], gpu["misses"], host["hits"], host["misses"]) == (6, 3, 0, 3)
    who = client_name(grpc_client.role)
    for view in _node_views(ps_endpoints, name):
        assert sorted(view) == [(who, layer.name, "gpu"), (who, layer.name, "host")]
        for stats in (gpu, host):
            cache = view[(who, layer.name, str(stats["tier"]))]
            figures = cache.figures  # type: ignore[attr-defined]
            assert (figures.hits, figures.misses, figures.evictions) == (
                stats["hits"], stats["misses"], stats["evictions"],
            )  # fmt: skip
            assert figures.hit_rate == pytest.approx(stats["hit_rate"])
            assert (figures.resident_rows, figures.resident_bytes, figures.capacity_bytes) == (
                stats["resident_rows"], stats["bytes_used"], stats["capacity_bytes"],
            )  # fmt: skip
            assert cache.policy == "lfu"  # type: ignore[attr-defined]
    assert view[(who, layer.name, "gpu")].figures.capacity_bytes <= 1 << 14  # type: ignore[attr-defined]


def test_a_layer_reports_on_its_first_lookup_then_once_per_interval(
    grpc_client: RecStoreClient, ps_endpoints: list[str]
) -> None:
    name = unique_name()
    layer = _layer(grpc_client, name)
    now = [100.0]
    layer._reporter = CacheReporter(layer._cached, 10, clock=lambda: now[0])  # type: ignore[arg-type]
    mine = (client_name(grpc_client.role), layer.name, "host")

    def reported_misses() -> int:
        return _node_views(ps_endpoints, name)[0][mine].figures.misses  # type: ignore[attr-defined]

    layer(torch.tensor([1]))
    assert reported_misses() == 1  # the first lookup reported
    now[0] += 9.9
    layer(torch.tensor([2]))
    assert reported_misses() == 1  # not due yet
    now[0] += 0.1
    layer(torch.tensor([3]))
    assert reported_misses() == 3  # due: the running totals went out


def test_a_failed_report_from_a_lookup_is_logged_and_the_lookup_still_answers(
    grpc_client: RecStoreClient, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_name()
    layer = _layer(grpc_client, name)
    expected = grpc_client.pull(name, torch.tensor([4]))
    grpc_client._for_modules.report_caches = _refuse  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="recstore.nve"):
        torch.testing.assert_close(layer(torch.tensor([4])), expected, rtol=0, atol=0)
    assert f"cache report for table {name} failed: node gone" in caplog.text
    with pytest.raises(ConnectionError, match="node gone"):  # asked for: raised
        layer.report_cache_stats()


def _refuse(name: str, caches: object) -> None:
    raise ConnectionError("node gone")


def test_a_layer_without_a_cache_has_nothing_to_report(local_client: RecStoreClient) -> None:
    layer = nve.NVEmbedding(
        ROWS, DIM, storage=nve.RemoteTable(local_client, unique_name()), device="cpu"
    )
    with pytest.raises(RuntimeError, match="has no host cache to report"):
        layer.report_cache_stats()


def test_the_report_interval_must_be_a_non_negative_integer(local_client: RecStoreClient) -> None:
    with pytest.raises(ValueError, match=r"config\['cache_report_interval'\] must be an integer"):
        _layer(local_client, unique_name(), cache_report_interval=-1)
