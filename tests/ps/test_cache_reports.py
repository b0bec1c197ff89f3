"""CacheReport: the node keeps clients' cache counters per table and tier and shows them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from recstore.core.cache_figures import (
    CacheFigures,
    ClientCache,
    client_cache_to_proto,
    engine_figures,
)
from recstore.core.errors import InvalidArgument
from recstore.core.proto_convert import table_stats_from_proto
from recstore.ps.cache_reports import MAX_CACHES_PER_TABLE, STALE_AFTER_S, CacheReports
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, spec

ADMIN, READER = "admin-s3cret", "reader-s3cret"


def _cache(
    client: str = "host:1:trainer", layer: str = "nve_0", hits: int = 3, tier: str = "host"
) -> ClientCache:
    figures = CacheFigures(hits=hits, misses=1, evictions=2, resident_rows=4,
                           resident_bytes=400, capacity_bytes=1000)  # fmt: skip
    return ClientCache(client, layer, "lfu", figures, tier=tier)


def _report(table: str, *caches: ClientCache) -> ps_pb2.CacheReportRequest:
    return ps_pb2.CacheReportRequest(table=table, caches=[client_cache_to_proto(c) for c in caches])


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_in_thread(
        "127.0.0.1", 0, data_dir=tmp_path, auth_token=ADMIN, read_only_token=READER
    )
    yield handle
    handle.stop(final_checkpoint=False)


def test_the_table_view_shows_the_latest_report_of_each_cache(node: ServerHandle) -> None:
    admin = Client(node.address, ADMIN)
    admin.create(spec("emb"))
    admin.call("CacheReport", _report("emb", _cache(hits=3), _cache(layer="nve_1", hits=7)))
    admin.call("CacheReport", _report("emb", _cache(hits=5)))  # running totals: replaces
    request = ps_pb2.GetTableStatsRequest(table="emb")
    stats = table_stats_from_proto(admin.call("GetTableStats", request))
    assert [(c.layer, c.figures.hits) for c in stats.client_caches] == [("nve_0", 5), ("nve_1", 7)]
    assert all(c.reported_unix > 0 for c in stats.client_caches)  # stamped by the node
    assert stats.client_caches[0].figures.hit_rate == pytest.approx(5 / 6)
    assert stats.engine_cache is None  # a host table has no GPU cache
    listed = admin.call("ListTables", ps_pb2.ListTablesRequest()).tables[0]
    assert len(listed.client_caches) == 2
    body = generate_latest(node.server.metrics.registry).decode()
    labels = 'client="host:1:trainer",layer="nve_0",policy="lfu",table="emb",tier="host"'
    assert f"recstore_ps_table_client_cache_hits_total{{{labels}}} 5.0" in body
    assert f"recstore_ps_table_client_cache_resident_bytes{{{labels}}} 400.0" in body
    # dropping the table drops its reports
    admin.call("DropTable", ps_pb2.DropTableRequest(table="emb"))
    admin.create(spec("emb"))
    again = admin.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    assert len(again.client_caches) == 0
    admin.close()


def test_a_layers_gpu_and_host_tiers_are_kept_apart_in_every_view(node: ServerHandle) -> None:
    admin = Client(node.address, ADMIN)
    admin.create(spec("emb"))
    gpu, host = _cache(tier="gpu", hits=9), _cache(tier="host", hits=2)
    admin.call("CacheReport", _report("emb", host, gpu))
    admin.call("CacheReport", _report("emb", _cache(tier="gpu", hits=11)))  # the GPU tier only
    request = ps_pb2.GetTableStatsRequest(table="emb")
    stats = table_stats_from_proto(admin.call("GetTableStats", request))
    shown = [(c.layer, c.tier, c.figures.hits) for c in stats.client_caches]
    assert shown == [("nve_0", "gpu", 11), ("nve_0", "host", 2)]  # lookup order: GPU first
    body = generate_latest(node.server.metrics.registry).decode()
    labels = 'client="host:1:trainer",layer="nve_0",policy="lfu",table="emb",tier="{}"'
    assert f"recstore_ps_table_client_cache_hits_total{{{labels.format('gpu')}}} 11.0" in body
    assert f"recstore_ps_table_client_cache_hits_total{{{labels.format('host')}}} 2.0" in body
    admin.close()


def test_a_report_from_before_tiers_counts_as_the_host_tier(node: ServerHandle) -> None:
    admin = Client(node.address, ADMIN)
    admin.create(spec("emb"))
    # what an older client sends: no tier field on the wire at all
    old = ps_pb2.CacheClientStats(
        client="old:1:trainer", layer="nve_0", policy="lru",
        counters=ps_pb2.CacheCounters(hits=4, misses=4),
    )  # fmt: skip
    assert "tier" not in {field.name for field, _ in old.ListFields()}
    admin.call("CacheReport", ps_pb2.CacheReportRequest(table="emb", caches=[old]))
    message = admin.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    (cache,) = table_stats_from_proto(message).client_caches
    assert (cache.client, cache.tier, cache.figures.hit_rate) == ("old:1:trainer", "host", 0.5)
    assert message.client_caches[0].tier == "host"  # the node names the tier it counted
    body = generate_latest(node.server.metrics.registry).decode()
    assert 'layer="nve_0",policy="lru",table="emb",tier="host"} 4.0' in body
    admin.close()


def test_a_serving_process_with_a_read_only_token_may_report(node: ServerHandle) -> None:
    admin, reader = Client(node.address, ADMIN), Client(node.address, READER)
    admin.create(spec("emb"))
    reader.call("CacheReport", _report("emb", _cache()))
    stats = admin.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    assert [c.client for c in stats.client_caches] == ["host:1:trainer"]
    admin.close()
    reader.close()


@pytest.mark.parametrize(
    ("caches", "message"),
    [
        ((_cache(client=""),), "needs the reporting client's name"),
        ((_cache(), _cache()), "reported twice"),
        ((_cache(tier="gpu"), _cache(tier="gpu")), "nve_0' / gpu reported twice"),
        ((_cache(tier="l2"),), "names tier 'l2'; a cache tier is one of gpu, host"),
        ((_cache(tier="HOST"),), "names tier 'HOST'"),
        ((_cache(layer="x" * 201),), "layer name longer than 200"),
        (tuple(_cache(layer=str(i)) for i in range(MAX_CACHES_PER_TABLE + 1)), "at most 128"),
    ],
)
def test_a_bad_report_is_refused_and_keeps_nothing(
    node: ServerHandle, caches: tuple[ClientCache, ...], message: str
) -> None:
    admin = Client(node.address, ADMIN)
    admin.create(spec("emb"))
    admin.call("CacheReport", _report("emb", _cache(client="before")))
    with pytest.raises(grpc.RpcError) as refused:
        admin.call("CacheReport", _report("emb", _cache(client="new"), *caches))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
    stats = admin.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    assert [c.client for c in stats.client_caches] == ["before"]
    admin.close()


def test_a_report_for_a_table_the_node_does_not_host_is_not_found(node: ServerHandle) -> None:
    admin = Client(node.address, ADMIN)
    with pytest.raises(grpc.RpcError) as refused:
        admin.call("CacheReport", _report("nope", _cache()))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    admin.close()


def test_reports_are_bounded_per_table_and_silent_caches_leave() -> None:
    now = [1000.0]
    reports = CacheReports(clock=lambda: now[0])
    for i in range(MAX_CACHES_PER_TABLE):
        reports.report("emb", [_cache(client=f"c{i:03}")])
        now[0] += 1
    reports.report("emb", [_cache(client="c000")])  # heard again: now the newest
    reports.report("emb", [_cache(client="late")])  # one too many: the longest silent goes
    held = {c.client for c in reports.of("emb")}
    assert len(held) == MAX_CACHES_PER_TABLE and "c001" not in held and {"c000", "late"} <= held
    now[0] += STALE_AFTER_S - 1
    last = f"c{MAX_CACHES_PER_TABLE - 1:03}"  # the loop's last: silent for just STALE_AFTER_S
    assert {c.client for c in reports.of("emb")} == {"c000", "late", last}
    now[0] += 2
    assert reports.of("emb") == []
    with pytest.raises(InvalidArgument):
        reports.report("emb", [_cache(client="")])


def test_engine_figures_come_from_the_gpu_cache_keys_only() -> None:
    assert engine_figures({"size": 3.0}) is None
    engine = {
        "cache_hits": 6.0, "cache_misses": 2.0, "cache_evictions": 1.0,
        "cache_resident_rows": 5.0, "cache_resident_bytes": 160.0, "cache_bytes": 900.0,
    }  # fmt: skip
    figures = engine_figures(engine)
    assert figures == CacheFigures(6, 2, 1, 5, 160, 900)
    assert figures is not None and figures.hit_rate == 0.75
