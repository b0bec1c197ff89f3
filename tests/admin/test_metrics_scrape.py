"""Reading PS-node metrics for the dashboard: the parser, a live scrape, metrics.json."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import start_http_server
from sqlalchemy import update

from recstore.admin import metrics_scrape
from recstore.admin.metrics_scrape import (
    NOT_PROVISIONED,
    metrics_url,
    parse_node_metrics,
    scrape_nodes,
)
from recstore.admin.models import NodeRecord
from recstore.ps.serve.metrics import Metrics

from .conftest import dashboard_login


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
    assert samples[2].error == NOT_PROVISIONED


def test_dashboard_metrics_json(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    live_node: str,
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
            headers=provisioner_headers,
        ).json()
        client.post(
            f"/api/v1/nodes/{node['id']}/heartbeat",
            json={"ready": True, "rows": 11, "memory_bytes": 22},
            headers=provisioner_headers,
        )
    anonymous = client.get("/ui/tables/emb/metrics.json", follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/ui/login"
    dashboard_login(client, admin_headers["Authorization"].split()[1])
    body = client.get("/ui/tables/emb/metrics.json").json()
    first, second = body["shards"]
    assert first["rows"] == 7 and first["requests_total"] == 3 and first["error"] is None
    assert second["rows"] == 11 and second["memory_bytes"] == 22  # heartbeat values
    assert second["error"] == NOT_PROVISIONED


@pytest.fixture
def target(fake_http: Any) -> Any:
    """A metrics endpoint answering every GET with ``target.answer`` (200, empty at first)."""
    return fake_http(lambda request: (200, {}, b""))


def _answers(target: Any, reply: tuple[int, dict[str, str], bytes]) -> None:
    target.answer = lambda request: reply


def _asked(target: Any) -> list[str]:
    return [request.path for request in target.requests]


def _scrape_one(endpoint: str) -> metrics_scrape.NodeSample:
    (sample,) = asyncio.run(scrape_nodes([endpoint], "emb", timeout=2.0))
    return sample


SECRET_LINE = b"root:x:0:0:the-secret-first-line"


def test_redirects_are_not_followed(target: Any) -> None:
    _answers(target, (302, {"Location": f"{target.url}/internal-secret"}, b""))
    sample = _scrape_one(target.address)
    assert sample.error == "HTTP 302: redirects are not followed"
    assert _asked(target) == ["/metrics"]  # the redirect target was never asked


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ((500, {}, SECRET_LINE), "HTTP 500"),
        ((404, {}, SECRET_LINE), "HTTP 404"),
        ((200, {}, SECRET_LINE + b"\n"), "the answer is not Prometheus text exposition"),
        ((200, {}, b"\xff\xfe" + SECRET_LINE), "the answer is not UTF-8 text"),
    ],
)
def test_errors_never_echo_the_body(
    target: Any, reply: tuple[int, dict[str, str], bytes], error: str
) -> None:
    _answers(target, reply)
    sample = _scrape_one(target.address)
    assert sample.error == error and sample.rows is None
    assert "secret" not in repr(sample.to_dict())


def test_large_answers_are_cut_off(target: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_scrape, "MAX_BODY_BYTES", 1024)
    _answers(target, (200, {}, b"# HELP x y\n" * 1000))
    assert _scrape_one(target.address).error == "the answer is larger than 1024 bytes"


def test_nodes_not_registered_by_the_provisioner_are_never_fetched(
    client: TestClient,
    app: FastAPI,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    target: Any,
) -> None:
    """A metrics URL whose registrar is not the provisioner (an older editor's row) is not asked."""
    spec = {"name": "emb", "numEmbeddings": 100, "embeddingDim": 4, "shards": 1}
    client.post("/api/v1/tables", json=spec, headers=admin_headers)
    body = {"table": "emb", "shard_index": 0, "endpoint": "h:1", "metrics_endpoint": target.address}
    assert client.post("/api/v1/nodes", json=body, headers=provisioner_headers).status_code == 201
    with app.state.context.sessions() as session:
        session.execute(update(NodeRecord).values(registered_role="editor"))
        session.commit()
    _answers(target, (200, {}, SECRET_LINE))
    dashboard_login(client, admin_headers["Authorization"].split()[1])
    (shard,) = client.get("/ui/tables/emb/metrics.json").json()["shards"]
    assert shard["error"] == NOT_PROVISIONED
    assert _asked(target) == []
