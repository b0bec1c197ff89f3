"""Nodes, discovery, operator status, checkpoints and the audit log, on both databases."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from recstore.admin.models import NodeRecord, TableRecord
from recstore.core import SlotMap


@pytest.fixture
def table(client: TestClient, admin_headers: dict[str, str]) -> str:
    spec = {
        "name": "users",
        "numEmbeddings": 100,
        "embeddingDim": 8,
        "dtype": "float16",
        "shards": 2,
    }
    assert client.post("/api/v1/tables", json=spec, headers=admin_headers).status_code == 201
    return "users"


def register(
    client: TestClient, headers: dict[str, str], shard: int, port: int, host: str = "127.0.0.1"
) -> dict[str, Any]:
    r = client.post(
        "/api/v1/nodes",
        json={
            "table": "users",
            "shard_index": shard,
            "endpoint": f"{host}:{port}",
            "metrics_endpoint": f"{host}:{port + 1}",
        },
        headers=headers,
    )
    assert r.status_code in (200, 201), r.text
    return r.json()


def test_discovery_from_node_registrations(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    # Registered out of order: discovery answers in shard order.
    register(client, provisioner_headers, 1, 6001)
    r = client.get(f"/api/v1/tables/{table}/discovery", headers=admin_headers)
    assert r.status_code == 503 and "[0]" in r.json()["detail"] and r.headers["retry-after"]
    register(client, provisioner_headers, 0, 5001)
    found = client.get(f"/api/v1/tables/{table}/discovery", headers=admin_headers).json()
    assert found["endpoints"] == ["127.0.0.1:5001", "127.0.0.1:6001"]
    assert found["dtype"] == "float16" and found["embedding_dim"] == 8
    assert found["num_embeddings"] == 100 and found["shards"] == 2
    assert found["slot_map"] == SlotMap.initial(2).to_dict()
    assert found["spec"]["dtype"] == "float16" and found["name"] == "users"


def test_reregistration_updates_in_place(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    first = register(client, provisioner_headers, 0, 5001)
    r = client.post(
        "/api/v1/nodes",
        json={"table": table, "shard_index": 0, "endpoint": "10.0.0.9:5001"},
        headers=provisioner_headers,
    )
    assert r.status_code == 200 and r.json()["id"] == first["id"]
    assert r.json()["endpoint"] == "10.0.0.9:5001"
    assert client.get("/api/v1/nodes", headers=admin_headers).json()["total"] == 1


def test_heartbeat_sizes_and_readiness(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    node = register(client, provisioner_headers, 0, 5001)
    register(client, provisioner_headers, 1, 6001)
    r = client.post(
        f"/api/v1/nodes/{node['id']}/heartbeat",
        json={"ready": True, "rows": 42, "memory_bytes": 4096},
        headers=provisioner_headers,
    )
    assert r.status_code == 200 and r.json()["ready"] is True and r.json()["last_heartbeat"]
    client.post(
        f"/api/v1/nodes/{node['id']}/heartbeat",
        json={"ready": True, "rows": 50, "memory_bytes": 5000},
        headers=provisioner_headers,
    )
    got = client.get(f"/api/v1/tables/{table}", headers=admin_headers).json()
    assert got["rows"] == 50 and got["memory_bytes"] == 5000
    ready = client.get("/api/v1/nodes?ready=true", headers=admin_headers).json()
    assert [n["shard_index"] for n in ready["items"]] == [0]
    # Only the change of readiness is audited, not every beat.
    actions = [
        e["action"]
        for e in client.get(f"/api/v1/events?table={table}", headers=admin_headers).json()["items"]
    ]
    assert actions.count("node.ready") == 1 and actions.count("node.register") == 2


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"table": "users", "shard_index": 2, "endpoint": "h:1"}, 422, "out of range"),
        ({"table": "users", "shard_index": 0, "endpoint": "no-port"}, 422, "host:port"),
        ({"table": "users", "shard_index": 0, "endpoint": "h:70000"}, 422, "1..65535"),
        ({"table": "users", "shard_index": -1, "endpoint": "h:1"}, 422, "greater than"),
        ({"table": "nope", "shard_index": 0, "endpoint": "h:1"}, 404, "nope"),
        (
            {"table": "users", "shard_index": 0, "endpoint": "h:1", "metrics_endpoint": "x y"},
            422,
            "host:port",
        ),
    ],
)
def test_bad_registration_writes_nothing(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
    body: dict[str, Any],
    status: int,
    fragment: str,
) -> None:
    r = client.post("/api/v1/nodes", json=body, headers=provisioner_headers)
    assert r.status_code == status and fragment in r.text
    assert client.get("/api/v1/nodes", headers=admin_headers).json()["total"] == 0


def test_bad_heartbeat_and_unknown_node(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    node = register(client, provisioner_headers, 0, 5001)
    r = client.post(
        f"/api/v1/nodes/{node['id']}/heartbeat",
        json={"ready": True, "rows": -1},
        headers=provisioner_headers,
    )
    assert r.status_code == 422
    assert client.get(f"/api/v1/nodes/{node['id']}", headers=admin_headers).json()["rows"] == 0
    r = client.post(
        "/api/v1/nodes/9999/heartbeat", json={"ready": True}, headers=provisioner_headers
    )
    assert r.status_code == 404


def test_status_then_discovery_of_registered_nodes(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    for shard in (0, 1):
        register(client, provisioner_headers, shard, 50051, host=f"users-{shard}.users")
    status = {
        "phase": "Ready",
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllShardsReady"}],
        "observedGeneration": 1,
        "shards": [
            {"index": 1, "endpoint": "users-1.users:50051", "ready": True},
            {"index": 0, "endpoint": "users-0.users:50051", "ready": True},
        ],
        "slotMapEpoch": 1,
        "lastCheckpoint": None,
    }
    r = client.put(f"/api/v1/tables/{table}/status", json=status, headers=provisioner_headers)
    assert r.status_code == 200, r.text
    assert r.json()["status"]["phase"] == "Ready"
    assert r.json()["status"]["conditions"][0]["reason"] == "AllShardsReady"
    found = client.get(f"/api/v1/tables/{table}/discovery", headers=admin_headers).json()
    assert found["endpoints"] == ["users-0.users:50051", "users-1.users:50051"]


@pytest.mark.parametrize("role", ["viewer", "editor", "admin"])
def test_only_the_provisioner_writes_status_or_registers_nodes(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    tokens: dict[str, str],
    table: str,
    role: str,
) -> None:
    """An editor (or admin) token cannot point trainers at another address."""
    register(client, provisioner_headers, 0, 5001)
    before = client.get(f"/api/v1/tables/{table}", headers=admin_headers).json()
    headers = {"Authorization": f"Bearer {tokens[role]}"}
    hijack = {"phase": "Ready", "shards": [{"index": 0, "endpoint": "evil.example:50051"}]}
    r = client.put(f"/api/v1/tables/{table}/status", json=hijack, headers=headers)
    assert r.status_code == 403 and "provisioner" in r.json()["detail"]
    r = client.post(
        "/api/v1/nodes",
        json={"table": table, "shard_index": 0, "endpoint": "evil.example:50051"},
        headers=headers,
    )
    assert r.status_code == 403 and "provisioner" in r.json()["detail"]
    assert client.get(f"/api/v1/tables/{table}", headers=admin_headers).json() == before
    nodes = client.get("/api/v1/nodes", headers=admin_headers).json()["items"]
    assert [n["endpoint"] for n in nodes] == ["127.0.0.1:5001"]


def test_a_provisioner_token_minted_through_the_api_writes_status(
    client: TestClient, admin_headers: dict[str, str], tokens: dict[str, str], table: str
) -> None:
    minted = {"Authorization": f"Bearer {tokens['provisioner']}"}
    node = register(client, minted, 0, 5001)
    assert node["provisioned"] and node["registered_by"] == "provisioner-user (token 4)"
    status = {"phase": "Ready", "shards": [{"index": 0, "endpoint": "127.0.0.1:5001"}]}
    r = client.put(f"/api/v1/tables/{table}/status", json=status, headers=minted)
    assert r.status_code == 200, r.text
    # It reads, but it cannot create tables.
    assert client.get("/api/v1/tables", headers=minted).status_code == 200
    spec = {"name": "other", "numEmbeddings": 1, "embeddingDim": 1}
    assert client.post("/api/v1/tables", json=spec, headers=minted).status_code == 403


@pytest.mark.parametrize(
    ("shards", "fragment"),
    [
        ([{"index": 0, "endpoint": "evil.example:50051"}], "registered at '127.0.0.1:5001'"),
        ([{"index": 1, "endpoint": "127.0.0.1:5001"}], "no node is registered for shard 1"),
    ],
)
def test_status_endpoint_of_no_registered_node_is_refused(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
    shards: list[dict[str, Any]],
    fragment: str,
) -> None:
    register(client, provisioner_headers, 0, 5001)
    before = client.get(f"/api/v1/tables/{table}", headers=admin_headers).json()
    r = client.put(
        f"/api/v1/tables/{table}/status",
        json={"phase": "Ready", "shards": shards},
        headers=provisioner_headers,
    )
    assert r.status_code == 422 and fragment in r.json()["detail"], r.text
    assert client.get(f"/api/v1/tables/{table}", headers=admin_headers).json() == before


def test_nodes_of_unknown_registrars_are_not_discovery_endpoints(
    client: TestClient,
    app: FastAPI,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    """Rows from before registrars were recorded (e.g. an editor's) are trusted for nothing."""
    for shard, port in ((0, 5001), (1, 6001)):
        register(client, provisioner_headers, shard, port)
    with app.state.context.sessions() as session:
        session.execute(update(NodeRecord).where(NodeRecord.shard_index == 1).values(
            registered_role=None, registered_by=None
        ))  # fmt: skip
        session.commit()
    r = client.get(f"/api/v1/tables/{table}/discovery", headers=admin_headers)
    assert r.status_code == 503 and "[1]" in r.json()["detail"]
    status = {"phase": "Ready", "shards": [{"index": 1, "endpoint": "127.0.0.1:6001"}]}
    r = client.put(f"/api/v1/tables/{table}/status", json=status, headers=provisioner_headers)
    assert r.status_code == 422 and "no node is registered for shard 1" in r.json()["detail"]


def test_a_stored_status_naming_another_address_is_not_served(
    client: TestClient,
    app: FastAPI,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    """A status written before endpoints were checked (by an editor, say) sends no one there."""
    for shard, port in ((0, 5001), (1, 6001)):
        register(client, provisioner_headers, shard, port)
    hijacked = [{"index": 0, "endpoint": "evil.example:50051", "ready": True}]
    with app.state.context.sessions() as session:
        session.execute(update(TableRecord).values(status_shards=hijacked))
        session.commit()
    found = client.get(f"/api/v1/tables/{table}/discovery", headers=admin_headers).json()
    assert found["endpoints"] == ["127.0.0.1:5001", "127.0.0.1:6001"]


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "ready"},
        {"phase": "Ready", "shards": [{"index": 5, "endpoint": "h:1"}]},
        {"phase": "Ready", "conditions": [{"type": "Ready", "status": "Maybe"}]},
        {"phase": "Ready", "slotMap": {"epoch": 2, "ranges": [[0, 10, 0]]}},
        {"phase": "Ready", "observedGeneration": -1},
    ],
)
def test_bad_status_changes_nothing(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
    status: dict[str, Any],
) -> None:
    before = client.get(f"/api/v1/tables/{table}", headers=admin_headers).json()
    r = client.put(f"/api/v1/tables/{table}/status", json=status, headers=provisioner_headers)
    assert r.status_code == 422
    assert client.get(f"/api/v1/tables/{table}", headers=admin_headers).json() == before


def test_checkpoint_request_and_completion(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    r = client.post(
        f"/api/v1/tables/{table}/checkpoints",
        json={"note": "before retrain"},
        headers=admin_headers,
    )
    assert r.status_code == 202
    checkpoint = r.json()
    assert checkpoint["state"] == "Requested" and checkpoint["table"] == table
    client.post(f"/api/v1/tables/{table}/checkpoints", headers=admin_headers)
    listed = client.get(f"/api/v1/tables/{table}/checkpoints", headers=admin_headers).json()
    assert listed["total"] == 2 and listed["items"][1]["id"] == checkpoint["id"]

    last = {"id": checkpoint["id"], "path": "/data/ckpt/3", "time": "2026-01-01T00:00:00Z"}
    client.put(
        f"/api/v1/tables/{table}/status",
        json={"phase": "Ready", "lastCheckpoint": last},
        headers=provisioner_headers,
    )
    done = client.get(
        f"/api/v1/tables/{table}/checkpoints?state=Completed", headers=admin_headers
    ).json()
    assert [c["id"] for c in done["items"]] == [checkpoint["id"]]
    assert done["items"][0]["completed_at"] is not None
    got = client.get(f"/api/v1/tables/{table}", headers=admin_headers).json()
    assert got["status"]["lastCheckpoint"] == last


def test_events_filter_and_paginate(
    client: TestClient, admin_headers: dict[str, str], table: str, tokens: dict[str, str]
) -> None:
    editor = {"Authorization": f"Bearer {tokens['editor']}"}
    client.post(f"/api/v1/tables/{table}/checkpoints", headers=editor)
    client.patch(f"/api/v1/tables/{table}", json={"shards": 3}, headers=editor)
    mine = client.get("/api/v1/events?actor=editor-user (token 2)", headers=admin_headers).json()
    assert [e["action"] for e in mine["items"]] == ["table.update", "checkpoint.request"]
    by_table = client.get(
        f"/api/v1/events?table={table}&limit=1&offset=1", headers=admin_headers
    ).json()
    assert by_table["total"] == 3 and len(by_table["items"]) == 1
    assert by_table["items"][0]["action"] == "checkpoint.request"


def test_deleting_a_table_removes_its_nodes_and_checkpoints(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    register(client, provisioner_headers, 0, 5001)
    client.post(f"/api/v1/tables/{table}/checkpoints", headers=admin_headers)
    assert client.delete(f"/api/v1/tables/{table}", headers=admin_headers).status_code == 204
    assert client.get("/api/v1/nodes", headers=admin_headers).json()["total"] == 0
    node_delete = client.delete("/api/v1/nodes/1", headers=admin_headers)
    assert node_delete.status_code == 404


def test_every_change_names_its_resource_in_the_audit_log(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    table: str,
) -> None:
    node = register(client, provisioner_headers, 0, 5001)
    beat = f"/api/v1/nodes/{node['id']}/heartbeat"
    client.post(beat, json={"ready": True}, headers=provisioner_headers)
    client.post(beat, json={"ready": False}, headers=provisioner_headers)
    checkpoint = client.post(f"/api/v1/tables/{table}/checkpoints", headers=admin_headers).json()
    client.put(
        f"/api/v1/tables/{table}/status", json={"phase": "Ready"}, headers=provisioner_headers
    )
    client.patch(f"/api/v1/tables/{table}", json={"optimizer": {"lr": 0.5}}, headers=admin_headers)
    token = client.post("/api/v1/tokens", json={"name": "ci"}, headers=admin_headers).json()
    client.delete(f"/api/v1/tokens/{token['id']}", headers=admin_headers)
    client.delete(f"/api/v1/nodes/{node['id']}", headers=admin_headers)
    client.delete(f"/api/v1/tables/{table}", headers=admin_headers)
    events = client.get("/api/v1/events?limit=500", headers=admin_headers).json()["items"]
    named = [
        (e["action"], e["resource_type"], e["resource_name"], e["table_name"])
        for e in reversed(events)
    ]
    assert named == [
        ("table.create", "table", table, table),
        ("node.register", "node", f"{table}/0", table),
        ("node.ready", "node", f"{table}/0", table),
        ("node.unready", "node", f"{table}/0", table),
        ("checkpoint.request", "checkpoint", f"{table}/{checkpoint['id']}", table),
        ("table.status", "table", table, table),
        ("table.update", "table", table, table),
        ("token.create", "token", "ci", None),
        ("token.revoke", "token", "ci", None),
        ("node.delete", "node", f"{table}/0", table),
        ("table.delete", "table", table, table),
    ]
