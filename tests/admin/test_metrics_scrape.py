"""Reading PS-node metrics for the dashboard: the parser, a live scrape, metrics.json."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import start_http_server

from recstore.admin.metrics_scrape import metrics_url, parse_node_metrics, scrape_nodes
from recstore.ps.metrics import Metrics


def node_registry(
    table: str, rows: int, requests: int, latencies: list[float]
) -> CollectorRegistry:
    """What a PS node exports: its own Metrics class, plus the per-table gauges it publishes."""
    metrics = Metrics()
    registry = metrics.registry
    rows_gauge = Gauge("recstore_ps_table_rows", "rows", ["table"], registry=registry)
    rows_gauge.labels(table).set(rows)
    rows_gauge.labels("someone_else").set(1000)  # another table on the same node
    Gauge("recstore_ps_table_memory_bytes", "bytes", ["table"], registry=registry).labels(
        table
    ).set(rows * 64)
    for i in range(requests):
        method = "Update" if i == 0 else "Pull"
        metrics.observe(method, "OK", latencies[i] if i < len(latencies) else 0.0)
    metrics.observe("GetTableStats", "OK", 100.0)  # control calls are not data QPS
    metrics.observe("ListTables", "OK", 100.0)
    return registry


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("10.0.0.1:9100", "http://10.0.0.1:9100/metrics"),
        ("http://h:1/custom", "http://h:1/custom"),
        ("https://h/metrics", "https://h/metrics"),
    ],
)
def test_metrics_url(endpoint: str, url: str) -> None:
    assert metrics_url(endpoint) == url


def test_parse_sums_the_tables_samples() -> None:
    text = generate_latest(node_registry("emb", rows=300, requests=20, latencies=[0.5, 1.5]))
    sample = parse_node_metrics(text.decode(), "emb")
    assert sample.rows == 300 and sample.memory_bytes == 300 * 64
    assert sample.requests_total == 20
    assert sample.latency_sum == pytest.approx(2.0) and sample.latency_count == 20
    assert sample.error is None
    assert parse_node_metrics(text.decode(), "absent").rows is None


@pytest.fixture
def live_node() -> Iterator[str]:
    server, thread = start_http_server(
        0, addr="127.0.0.1", registry=node_registry("emb", 7, 3, [0.01])
    )
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=10)


def test_scrape_live_and_unreachable_nodes(live_node: str) -> None:
    samples = asyncio.run(scrape_nodes([live_node, "127.0.0.1:9", None], "emb", timeout=2.0))
    assert samples[0].rows == 7 and samples[0].requests_total == 3
    assert samples[1].error and samples[1].rows is None
    assert samples[2].error == "no metrics endpoint registered"


def test_dashboard_metrics_json(
    client: TestClient, admin_headers: dict[str, str], live_node: str
) -> None:
    spec = {"name": "emb", "numEmbeddings": 100, "embeddingDim": 4, "shards": 2}
    client.post("/api/v1/tables", json=spec, headers=admin_headers)
    for shard, metrics in ((0, live_node), (1, None)):
        node = client.post(
            "/api/v1/nodes",
            json={
                "table": "emb",
                "shard_index": shard,
                "endpoint": f"h:{5000 + shard}",
                "metrics_endpoint": metrics,
            },
            headers=admin_headers,
        ).json()
        client.post(
            f"/api/v1/nodes/{node['id']}/heartbeat",
            json={"ready": True, "rows": 11, "memory_bytes": 22},
            headers=admin_headers,
        )
    anonymous = client.get("/ui/tables/emb/metrics.json", follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/ui/login"
    client.cookies.set("recstore_token", admin_headers["Authorization"].split()[1])
    body = client.get("/ui/tables/emb/metrics.json").json()
    first, second = body["shards"]
    assert first["rows"] == 7 and first["requests_total"] == 3 and first["error"] is None
    assert second["rows"] == 11 and second["memory_bytes"] == 22  # heartbeat values
    assert second["error"] == "no metrics endpoint registered"
