"""Where the GPU layer types put their rows, checked on every machine: the table
spec fields of each type and the options each refuses (recstore.nve.device_tables)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from recstore.client import RecStoreClient
from recstore.client.nve.config import LayerType, parse_config
from recstore.client.nve.device_tables import device_storage, placement
from recstore.client.specs import build_spec
from recstore.nve import HostMemBlock, RemoteTable


@pytest.mark.parametrize(
    ("layer_type", "cache", "fields"),
    [
        (LayerType.GPULayer, 0, {"storage": "gpu"}),
        (LayerType.LinearUVM, 4096, {"storage": "gpu_cache", "gpu_cache": {"bytes": 4096}}),
    ],
)
def test_each_type_places_its_rows(layer_type: LayerType, cache: int, fields: Any) -> None:
    assert placement(layer_type, cache, parse_config(None)) == fields
    spec = build_spec("t", (1000, 8), "float32", metadata=fields)  # a spec the store takes
    assert spec.storage == fields["storage"]


@pytest.mark.parametrize(
    ("layer_type", "cache", "config", "message"),
    [
        (LayerType.GPULayer, 1024, None, "gpu_cache_size must be 0"),
        (LayerType.LinearUVM, 0, None, "gpu_cache_size must be > 0"),
        (LayerType.LinearUVM, 4096, {"host_cache_size": 4096}, "host_cache_size"),
        (LayerType.GPULayer, 0, {"max_staleness_steps": 2}, "max_staleness_steps"),
    ],
)
def test_bad_options_are_refused(
    layer_type: LayerType, cache: int, config: dict[str, int] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        placement(layer_type, cache, parse_config(config))


def test_a_cache_too_small_for_one_row_and_its_slot_is_refused() -> None:
    fields = placement(LayerType.LinearUVM, 8 * 4 + 15, parse_config(None))
    with pytest.raises(ValueError, match="holds no row"):
        build_spec("t", (1000, 8), "float32", metadata=fields)


def test_storage_must_be_an_in_process_table() -> None:
    client = RecStoreClient(role="test-nve-device-tables")
    client.set_ps_backend("local")
    mine = RemoteTable(client, "mine")
    assert device_storage(LayerType.GPULayer, mine, "ignored") is mine
    assert device_storage(LayerType.LinearUVM, None, "named").name == "named"
    with pytest.raises(TypeError, match="in-process"):
        device_storage(LayerType.GPULayer, HostMemBlock(8, 10), "x")
    remote = RecStoreClient(role="test-nve-device-tables-remote")
    remote.set_ps_backend("grpc")
    with pytest.raises(TypeError, match=r"LayerType\.Hierarchical"):
        device_storage(LayerType.LinearUVM, RemoteTable(remote, "far"), "x")


def test_the_export_leaves_out_what_a_tier_does_not_count() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from recstore.client.nve import metrics

    class EngineCached:  # what a LinearUVM layer's cache_stats() holds
        def cache_stats(self) -> dict[str, object]:
            return {"table": "t", "layer": "l", "tier": "gpu", "hits": 3, "misses": 1,
                    "evictions": 0, "hit_rate": 0.75, "bytes_used": 80, "capacity_bytes": 160,
                    "gpu": None}  # fmt: skip

    layer = EngineCached()
    metrics.track(layer)
    registry = prometheus_client.CollectorRegistry()
    metrics.register_cache_metrics(registry)
    labels = {"table": "t", "layer": "l", "tier": "gpu"}
    assert registry.get_sample_value("recstore_nve_cache_hits_total", labels) == 3
    assert registry.get_sample_value("recstore_nve_cache_hit_rate", labels) == 0.75
    assert registry.get_sample_value("recstore_nve_cache_rejected_total", labels) is None


def test_a_device_table_shows_its_engine_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from recstore.client.nve.device_tables import DeviceTable

    client = RecStoreClient(role="test-nve-device-tables")
    client.set_ps_backend("local")
    storage = RemoteTable(client, "engine_cached")
    storage.bind(100, 8, torch.float32, None, True)  # a host table stands in for the tier
    table = DeviceTable(storage)
    assert table.cache_stats("layer") is None  # no cache_* figures: a GPULayer's table
    engine = {
        "cache_hits": 6, "cache_misses": 2, "cache_evictions": 1,
        "cache_resident_rows": 4, "cache_resident_bytes": 128, "cache_bytes": 192,
    }  # fmt: skip
    host = table._backend.table("engine_cached")
    monkeypatch.setattr(host, "stats", lambda: engine)
    stats = table.cache_stats("layer")
    assert stats is not None
    assert (stats["table"], stats["layer"], stats["tier"]) == ("engine_cached", "layer", "gpu")
    assert (stats["hits"], stats["misses"], stats["hit_rate"]) == (6, 2, 0.75)
    assert (stats["bytes_used"], stats["capacity_bytes"]) == (128, 192)
