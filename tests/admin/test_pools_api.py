"""Pools through the API on SQLite and PostgreSQL: create, list, get, patch, delete, status,
tables placed on a pool, and what is refused (writing nothing)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from recstore.core.pool import PoolSpec

POOL = {"name": "criteo", "shards": 2, "checkpoint": {"intervalSeconds": 600, "keep": 3}}
TABLE = {"name": "c1", "numEmbeddings": 1460, "embeddingDim": 16}


def post(client: TestClient, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    r = client.post(f"/api/v1/{path}", json=body, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def everything(client: TestClient, headers: dict[str, str]) -> tuple[Any, Any, Any]:
    """What a refused request must leave as it was: pools, tables, the audit log."""
    return (
        client.get("/api/v1/pools?limit=500", headers=headers).json(),
        client.get("/api/v1/tables?limit=500", headers=headers).json(),
        client.get("/api/v1/events?limit=500", headers=headers).json()["total"],
    )


def test_pool_lifecycle_and_its_audit(client: TestClient, admin_headers: dict[str, str]) -> None:
    body = post(client, "pools", POOL, admin_headers)
    declared = {k: v for k, v in POOL.items() if k != "name"}
    assert body["spec"] == PoolSpec.model_validate(declared).to_wire()
    assert body["phase"] == "Pending" and body["status"] is None and body["tables"] == []
    r = client.get("/api/v1/pools/criteo", headers=admin_headers)
    assert r.status_code == 200 and r.headers["etag"] == '"1"'
    listed = client.get("/api/v1/pools", headers=admin_headers).json()
    assert [p["name"] for p in listed["items"]] == ["criteo"] and listed["total"] == 1

    r = client.patch(
        "/api/v1/pools/criteo", json={"placement": {"resources": {"memory": "4Gi"}}},
        headers={**admin_headers, "If-Match": "1"},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["placement"]["resources"]["memory"] == "4Gi"
    assert r.json()["generation"] == 2
    stale = client.patch(
        "/api/v1/pools/criteo", json={"shards": 3}, headers={**admin_headers, "If-Match": "1"}
    )
    assert stale.status_code == 409

    assert client.delete("/api/v1/pools/criteo", headers=admin_headers).status_code == 204
    assert client.get("/api/v1/pools/criteo", headers=admin_headers).status_code == 404
    events = client.get("/api/v1/events", headers=admin_headers).json()["items"]
    assert [e["action"] for e in events[:3]] == ["pool.delete", "pool.update", "pool.create"]
    assert all(e["resource_type"] == "pool" and e["resource_name"] == "criteo" for e in events[:3])
    assert events[1]["before"]["spec"]["placement"]["resources"]["memory"] == "2Gi"


def test_a_table_on_a_pool_takes_its_shards_and_blocks_its_deletion(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    post(client, "pools", POOL, admin_headers)
    table = post(client, "tables", {**TABLE, "pool": "criteo"}, admin_headers)
    assert table["pool"] == "criteo"
    assert table["spec"]["shards"] == 2  # the pool's nodes
    assert table["spec"]["checkpoint"]["intervalSeconds"] == 600  # the pool's checkpoints
    assert client.get("/api/v1/pools/criteo", headers=admin_headers).json()["tables"] == ["c1"]

    before = everything(client, admin_headers)
    r = client.delete("/api/v1/pools/criteo", headers=admin_headers)
    assert r.status_code == 409 and "still holds tables c1" in r.json()["detail"]
    assert everything(client, admin_headers) == before

    moved = client.patch("/api/v1/tables/c1", json={"shards": 3}, headers=admin_headers)
    assert moved.status_code == 422 and "change the pool instead" in moved.json()["detail"]
    assert everything(client, admin_headers) == before

    assert client.delete("/api/v1/tables/c1", headers=admin_headers).status_code == 204
    assert client.delete("/api/v1/pools/criteo", headers=admin_headers).status_code == 204


def test_a_pools_new_shards_are_its_tables_and_audited(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    post(client, "pools", POOL, admin_headers)
    post(client, "tables", {**TABLE, "pool": "criteo"}, admin_headers)
    r = client.patch("/api/v1/pools/criteo", json={"shards": 3}, headers=admin_headers)
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["shards"] == 3
    moved = client.get("/api/v1/tables/c1", headers=admin_headers).json()
    # the table is recorded at the pool's new count: its map moves there (a move is due)
    assert moved["spec"]["shards"] == 3 and moved["reshard_required"] is True
    event = client.get("/api/v1/events", headers=admin_headers).json()["items"][0]
    assert event["action"] == "pool.update" and event["resource_name"] == "criteo"
    assert (event["before"]["spec"]["shards"], event["after"]["spec"]["shards"]) == (2, 3)


def test_a_table_declared_before_its_pool_takes_the_pools_shards_when_it_comes(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    waiting = post(client, "tables", {**TABLE, "pool": "criteo"}, admin_headers)
    assert waiting["spec"]["shards"] == 1 and waiting["status"]["phase"] == "Pending"
    post(client, "pools", POOL, admin_headers)
    placed = client.get("/api/v1/tables/c1", headers=admin_headers).json()
    assert placed["spec"]["shards"] == 2 and placed["reshard_required"] is False


def test_what_a_table_on_a_pool_may_not_declare(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    post(client, "pools", POOL, admin_headers)
    before = everything(client, admin_headers)
    refusals = {
        "shards": ({**TABLE, "pool": "criteo", "shards": 2}, "runs on the pool's nodes"),
        "gpu": ({**TABLE, "pool": "criteo", "storage": "gpu"}, "needs GPUs"),
        "checkpoint": (
            {**TABLE, "pool": "criteo", "checkpoint": {"intervalSeconds": 60}},
            "checkpoint every table they hold",
        ),
        "pool name": ({**TABLE, "pool": "Not_A_Label"}, "not the name of an EmbeddingPool"),
    }
    for case, (body, words) in refusals.items():
        r = client.post("/api/v1/tables", json=body, headers=admin_headers)
        assert r.status_code == 422 and words in r.text, (case, r.text)
    assert everything(client, admin_headers) == before


def test_bad_pools_are_refused_writing_nothing(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    post(client, "pools", POOL, admin_headers)
    before = everything(client, admin_headers)
    for body in (
        {**POOL},  # the name exists
        {"name": "Bad_Name", "shards": 1},
        {"name": "zero", "shards": 0},
        {"name": "gpu-mem", "gpuMemory": "80Gi"},  # without GPUs
        {"name": "extra", "unknown": 1},
    ):
        r = client.post("/api/v1/pools", json=body, headers=admin_headers)
        assert r.status_code in (409, 422), (body, r.status_code)
    r = client.patch("/api/v1/pools/criteo", json={"shards": 0}, headers=admin_headers)
    assert r.status_code == 422 and "spec.shards" in r.text
    assert everything(client, admin_headers) == before


def test_the_provisioner_reports_a_pools_status(
    client: TestClient, admin_headers: dict[str, str], provisioner_headers: dict[str, str]
) -> None:
    post(client, "pools", POOL, admin_headers)
    status = {
        "phase": "Ready", "readyShards": 2,
        "tables": [{"name": "c1", "phase": "Ready", "shards": 2, "memoryBytes": 1024}],
        "memory": {"requestBytes": 2**31, "nodeBytes": 150 * 2**20, "reservedBytes": 1024},
    }  # fmt: skip
    r = client.put("/api/v1/pools/criteo/status", json=status, headers=provisioner_headers)
    assert r.status_code == 200, r.text
    pool = client.get("/api/v1/pools/criteo", headers=admin_headers).json()
    assert pool["phase"] == "Ready"
    assert pool["status"]["memory"]["reservedBytes"] == 1024
    assert pool["status"]["tables"][0]["name"] == "c1"
    actions = [
        e["action"] for e in client.get("/api/v1/events", headers=admin_headers).json()["items"]
    ]
    assert actions[0] == "pool.status"
    bad = client.put("/api/v1/pools/criteo/status", json={"phase": "Nope"},
                     headers=provisioner_headers)  # fmt: skip
    assert bad.status_code == 422
