"""A table's caches in the admin API: the engine's GPU cache per shard (the gpu_cache tier's
CPU twin, ``_native.CacheTable``, counting real lookups) and clients' caches per tier (host
and GPU), read from the nodes' own metrics over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.exposition import start_http_server

from recstore import _native
from recstore.admin.metrics_scrape import parse_node_metrics
from recstore.core import TableSpec
from recstore.core.cache_figures import CacheFigures, ClientCache, engine_figures
from recstore.ps.cache_reports import CacheReports
from recstore.ps.serve.metrics import Metrics
from recstore.store.options import native_cache_options, native_options

from .conftest import dashboard_login

NAME = "cached"


class _Hosted:
    """What the node's table collector reads of a hosted table: its ``table``."""

    def __init__(self, table: object) -> None:
        self.table = table


def _twin(shard: int, keys: list[int]) -> Any:
    """Shard ``shard`` of a gpu_cache table on its CPU twin, after two lookups of ``keys``."""
    spec = TableSpec(
        name=NAME, num_embeddings=1000, embedding_dim=8, shards=2,
        storage="gpu_cache", gpu_cache={"rows": 128, "ways": 4},
    )  # fmt: skip
    twin = _native.CacheTable(
        native_options(spec, shard, 2, _native), native_cache_options(spec, shard, 2, _native)
    )
    batch = np.array(keys, dtype=np.int64)
    for _ in range(2):
        twin.pull(batch, np.empty((len(keys), 8), np.float32))
    return twin


def _figures(hits: int, reported: float, tier: str = "host") -> ClientCache:
    return ClientCache("trainer-host:7:train", "nve_0", "lfu",
                       CacheFigures(hits, 4, 1, 3, 300, 1000), reported, tier)  # fmt: skip


@pytest.fixture
def nodes() -> Iterator[tuple[list[str], list[Any]]]:
    """Two nodes' metrics endpoints: a twin shard each, and the same client reported to both."""
    endpoints, servers, twins = [], [], []
    now = [10.0]
    for shard, keys in ((0, [1, 2, 1]), (1, [5, 6, 7, 8])):
        twin = _twin(shard, keys)
        reports = CacheReports(clock=lambda: now[0])
        # the report to shard 1 arrived later (newer totals): that one is shown; the
        # layer's GPU tier reports beside its host tier
        host = _figures(hits=9 if shard == 0 else 6, reported=0)
        gpu = _figures(hits=12 if shard == 0 else 16, reported=0, tier="gpu")
        reports.report(NAME, [host, gpu])
        now[0] += 1
        metrics = Metrics(lambda twin=twin: {NAME: _Hosted(twin)}, client_caches=reports.of)  # type: ignore[misc]
        server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
        servers.append((server, thread))
        endpoints.append(f"127.0.0.1:{server.server_port}")
        twins.append(twin)
    yield endpoints, twins
    for server, thread in servers:
        server.shutdown()
        thread.join(timeout=10)


def _register(client: TestClient, provisioner: dict[str, str], endpoints: list[str]) -> None:
    for shard, metrics in enumerate(endpoints):
        client.post(
            "/api/v1/nodes", headers=provisioner,
            json={"table": NAME, "shard_index": shard, "endpoint": f"h:{5000 + shard}",
                  "metrics_endpoint": metrics},
        ).raise_for_status()  # fmt: skip


def test_the_table_cache_view_reads_the_engine_and_client_caches_of_every_shard(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    nodes: tuple[list[str], list[Any]],
) -> None:
    endpoints, twins = nodes
    spec = {"name": NAME, "numEmbeddings": 1000, "embeddingDim": 8, "shards": 2}
    client.post("/api/v1/tables", json=spec, headers=admin_headers).raise_for_status()
    _register(client, provisioner_headers, endpoints)
    body = client.get(f"/api/v1/tables/{NAME}/cache", headers=admin_headers).json()
    expected = [engine_figures(t.stats()) for t in twins]
    assert expected[0] is not None and expected[1] is not None
    # what the twins counted: 3 + 4 misses on the first lookups, then all hits
    assert (expected[0].hits, expected[0].misses, expected[1].hits) == (3, 3, 4)
    for shard, figures in zip(body["shards"], expected, strict=True):
        assert figures is not None and shard["engine"] == figures.as_dict()
        assert shard["error"] is None
    total = body["engine_total"]
    assert (total["hits"], total["misses"]) == (7, 7) and total["hit_rate"] == 0.5
    assert total["resident_rows"] == expected[0].resident_rows + expected[1].resident_rows
    assert total["resident_bytes"] == 6 * 8 * 4  # six distinct rows (2 + 4) of 8 float32
    # the client reported to both nodes: each tier shown once, from its newest report
    # (shard 1's), the GPU tier first (lookup order), and summed per tier, never across
    gpu, host = body["clients"]
    assert (host["client"], host["layer"], host["tier"], host["hits"], host["reported_unix"]) == (
        "trainer-host:7:train", "nve_0", "host", 6, 11.0,
    )  # fmt: skip
    assert (gpu["layer"], gpu["tier"], gpu["hits"], gpu["capacity_bytes"]) == (
        "nve_0", "gpu", 16, 1000,
    )  # fmt: skip
    assert sorted(body["clients_total"]) == ["gpu", "host"]
    assert body["clients_total"]["host"]["hit_rate"] == pytest.approx(0.6)
    assert body["clients_total"]["gpu"]["hit_rate"] == pytest.approx(0.8)
    # the dashboard's polling answer carries the same view
    dashboard_login(client, admin_headers["Authorization"].split()[1])
    assert client.get(f"/ui/tables/{NAME}/metrics.json").json()["cache"] == body


def test_a_table_without_caches_has_an_empty_view(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    spec = {"name": "plain", "numEmbeddings": 10, "embeddingDim": 4}
    client.post("/api/v1/tables", json=spec, headers=admin_headers).raise_for_status()
    body = client.get("/api/v1/tables/plain/cache", headers=admin_headers).json()
    assert body == {"shards": [], "engine_total": None, "clients": [], "clients_total": {}}
    assert client.get("/api/v1/tables/nope/cache", headers=admin_headers).status_code == 404


def test_a_node_from_before_tiers_shows_its_client_caches_as_host_caches() -> None:
    text = (
        "# TYPE recstore_ps_table_client_cache_hits counter\n"
        'recstore_ps_table_client_cache_hits_total{client="c:1:t",layer="nve_0",policy="lfu",'
        'table="cached"} 3.0\n'
        "# TYPE recstore_ps_table_client_cache_misses counter\n"
        'recstore_ps_table_client_cache_misses_total{client="c:1:t",layer="nve_0",policy="lfu",'
        'table="cached"} 1.0\n'
    )
    (cache,) = parse_node_metrics(text, NAME).client_caches
    assert (cache.client, cache.layer, cache.tier, cache.figures.hit_rate) == (
        "c:1:t", "nve_0", "host", 0.75,
    )  # fmt: skip
