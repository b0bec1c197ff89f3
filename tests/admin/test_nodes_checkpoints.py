"""Nodes, discovery, operator status, checkpoints and the audit log, on both databases."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from recstore.admin.models import NodeRecord, TableRecord
from recstore.core import SlotMap
from recstore.core.checkpoint_status import ShardCheckpoint, outcome
from recstore.core.reconcile import Observation, ShardState, compute_status
from recstore.core.status import TableStatus


@dataclass(frozen=True)
class Users:
    """The table "users" (float16, 2 shards) and the two callers these tests act as: the
    admin, who reads and requests, and the provisioner, who registers nodes and writes
    status."""

    client: TestClient
    admin: dict[str, str]
    provisioner: dict[str, str]
    table: str = "users"

    def read(self, path: str) -> Any:
        """The JSON body of a GET as the admin."""
        return self.client.get(path, headers=self.admin).json()

    def row(self) -> Any:
        """The table as the API serves it."""
        return self.read(f"/api/v1/tables/{self.table}")

    def register(
        self, shard: int, port: int, host: str = "127.0.0.1", headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Register shard ``shard`` at host:port (metrics at port + 1), as the provisioner."""
        r = self.client.post(
            "/api/v1/nodes",
            json={
                "table": self.table,
                "shard_index": shard,
                "endpoint": f"{host}:{port}",
                "metrics_endpoint": f"{host}:{port + 1}",
            },
            headers=headers or self.provisioner,
        )
        assert r.status_code in (200, 201), r.text
        return r.json()

    def put_status(self, status: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        """PUT the table's status, as the provisioner unless ``headers`` say otherwise."""
        return self.client.put(
            f"/api/v1/tables/{self.table}/status", json=status, headers=headers or self.provisioner
        )


@pytest.fixture
def users(
    client: TestClient, admin_headers: dict[str, str], provisioner_headers: dict[str, str]
) -> Users:
    spec = {
        "name": "users",
        "numEmbeddings": 100,
        "embeddingDim": 8,
        "dtype": "float16",
        "shards": 2,
    }
    assert client.post("/api/v1/tables", json=spec, headers=admin_headers).status_code == 201
    return Users(client, admin_headers, provisioner_headers)


def test_discovery_from_node_registrations(users: Users) -> None:
    # Registered out of order: discovery answers in shard order.
    users.register(1, 6001)
    r = users.client.get(f"/api/v1/tables/{users.table}/discovery", headers=users.admin)
    assert r.status_code == 503 and "[0]" in r.json()["detail"] and r.headers["retry-after"]
    users.register(0, 5001)
    found = users.read(f"/api/v1/tables/{users.table}/discovery")
    assert found["endpoints"] == ["127.0.0.1:5001", "127.0.0.1:6001"]
    assert found["dtype"] == "float16" and found["embedding_dim"] == 8
    assert found["num_embeddings"] == 100 and found["shards"] == 2
    assert found["slot_map"] == SlotMap.initial(2).to_dict()
    assert found["spec"]["dtype"] == "float16" and found["name"] == "users"


def test_reregistration_updates_in_place(users: Users) -> None:
    first = users.register(0, 5001)
    r = users.client.post(
        "/api/v1/nodes",
        json={"table": users.table, "shard_index": 0, "endpoint": "10.0.0.9:5001"},
        headers=users.provisioner,
    )
    assert r.status_code == 200 and r.json()["id"] == first["id"]
    assert r.json()["endpoint"] == "10.0.0.9:5001"
    assert users.read("/api/v1/nodes")["total"] == 1


def test_heartbeat_sizes_and_readiness(users: Users) -> None:
    node = users.register(0, 5001)
    users.register(1, 6001)
    beat = f"/api/v1/nodes/{node['id']}/heartbeat"
    r = users.client.post(
        beat, json={"ready": True, "rows": 42, "memory_bytes": 4096}, headers=users.provisioner
    )
    assert r.status_code == 200 and r.json()["ready"] is True and r.json()["last_heartbeat"]
    users.client.post(
        beat, json={"ready": True, "rows": 50, "memory_bytes": 5000}, headers=users.provisioner
    )
    got = users.row()
    assert got["rows"] == 50 and got["memory_bytes"] == 5000
    ready = users.read("/api/v1/nodes?ready=true")
    assert [n["shard_index"] for n in ready["items"]] == [0]
    # Only the change of readiness is audited, not every beat.
    actions = [e["action"] for e in users.read(f"/api/v1/events?table={users.table}")["items"]]
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
    users: Users, body: dict[str, Any], status: int, fragment: str
) -> None:
    r = users.client.post("/api/v1/nodes", json=body, headers=users.provisioner)
    assert r.status_code == status and fragment in r.text
    assert users.read("/api/v1/nodes")["total"] == 0


def test_bad_heartbeat_and_unknown_node(users: Users) -> None:
    node = users.register(0, 5001)
    r = users.client.post(
        f"/api/v1/nodes/{node['id']}/heartbeat",
        json={"ready": True, "rows": -1},
        headers=users.provisioner,
    )
    assert r.status_code == 422
    assert users.read(f"/api/v1/nodes/{node['id']}")["rows"] == 0
    r = users.client.post(
        "/api/v1/nodes/9999/heartbeat", json={"ready": True}, headers=users.provisioner
    )
    assert r.status_code == 404


def test_status_then_discovery_of_registered_nodes(users: Users) -> None:
    for shard in (0, 1):
        users.register(shard, 50051, host=f"users-{shard}.users")
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
    r = users.put_status(status)
    assert r.status_code == 200, r.text
    assert r.json()["status"]["phase"] == "Ready"
    assert r.json()["status"]["conditions"][0]["reason"] == "AllShardsReady"
    found = users.read(f"/api/v1/tables/{users.table}/discovery")
    assert found["endpoints"] == ["users-0.users:50051", "users-1.users:50051"]


@pytest.mark.parametrize("role", ["viewer", "editor", "admin"])
def test_only_the_provisioner_writes_status_or_registers_nodes(
    tokens: dict[str, str], users: Users, role: str
) -> None:
    """An editor (or admin) token cannot point trainers at another address."""
    users.register(0, 5001)
    before = users.row()
    headers = {"Authorization": f"Bearer {tokens[role]}"}
    hijack = {"phase": "Ready", "shards": [{"index": 0, "endpoint": "evil.example:50051"}]}
    r = users.put_status(hijack, headers)
    assert r.status_code == 403 and "provisioner" in r.json()["detail"]
    r = users.client.post(
        "/api/v1/nodes",
        json={"table": users.table, "shard_index": 0, "endpoint": "evil.example:50051"},
        headers=headers,
    )
    assert r.status_code == 403 and "provisioner" in r.json()["detail"]
    assert users.row() == before
    nodes = users.read("/api/v1/nodes")["items"]
    assert [n["endpoint"] for n in nodes] == ["127.0.0.1:5001"]


def test_a_provisioner_token_minted_through_the_api_writes_status(
    tokens: dict[str, str], users: Users
) -> None:
    minted = {"Authorization": f"Bearer {tokens['provisioner']}"}
    node = users.register(0, 5001, headers=minted)
    assert node["provisioned"] and node["registered_by"] == "provisioner-user (token 4)"
    status = {"phase": "Ready", "shards": [{"index": 0, "endpoint": "127.0.0.1:5001"}]}
    r = users.put_status(status, minted)
    assert r.status_code == 200, r.text
    # It reads, but it cannot create tables.
    assert users.client.get("/api/v1/tables", headers=minted).status_code == 200
    spec = {"name": "other", "numEmbeddings": 1, "embeddingDim": 1}
    assert users.client.post("/api/v1/tables", json=spec, headers=minted).status_code == 403


@pytest.mark.parametrize(
    ("shards", "fragment"),
    [
        ([{"index": 0, "endpoint": "evil.example:50051"}], "registered at '127.0.0.1:5001'"),
        ([{"index": 1, "endpoint": "127.0.0.1:5001"}], "no node is registered for shard 1"),
    ],
)
def test_status_endpoint_of_no_registered_node_is_refused(
    users: Users, shards: list[dict[str, Any]], fragment: str
) -> None:
    users.register(0, 5001)
    before = users.row()
    r = users.put_status({"phase": "Ready", "shards": shards})
    assert r.status_code == 422 and fragment in r.json()["detail"], r.text
    assert users.row() == before


def test_nodes_of_unknown_registrars_are_not_discovery_endpoints(
    users: Users, app: FastAPI
) -> None:
    """Rows from before registrars were recorded (e.g. an editor's) are trusted for nothing."""
    for shard, port in ((0, 5001), (1, 6001)):
        users.register(shard, port)
    with app.state.context.sessions() as session:
        session.execute(update(NodeRecord).where(NodeRecord.shard_index == 1).values(
            registered_role=None, registered_by=None
        ))  # fmt: skip
        session.commit()
    r = users.client.get(f"/api/v1/tables/{users.table}/discovery", headers=users.admin)
    assert r.status_code == 503 and "[1]" in r.json()["detail"]
    status = {"phase": "Ready", "shards": [{"index": 1, "endpoint": "127.0.0.1:6001"}]}
    r = users.put_status(status)
    assert r.status_code == 422 and "no node is registered for shard 1" in r.json()["detail"]


def test_a_stored_status_naming_another_address_is_not_served(users: Users, app: FastAPI) -> None:
    """A status written before endpoints were checked (by an editor, say) sends no one there."""
    for shard, port in ((0, 5001), (1, 6001)):
        users.register(shard, port)
    hijacked = [{"index": 0, "endpoint": "evil.example:50051", "ready": True}]
    with app.state.context.sessions() as session:
        session.execute(update(TableRecord).values(status_shards=hijacked))
        session.commit()
    found = users.read(f"/api/v1/tables/{users.table}/discovery")
    assert found["endpoints"] == ["127.0.0.1:5001", "127.0.0.1:6001"]


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "ready"},
        {"phase": "Ready", "shards": [{"index": 5, "endpoint": "h:1"}]},
        {"phase": "Ready", "conditions": [{"type": "Ready", "status": "Maybe"}]},
        {"phase": "Ready", "slotMap": {"epoch": 2, "ranges": [[0, 10, 0]]}},
        {"phase": "Ready", "observedGeneration": -1},
        {"phase": "Unknown"},
        # the checkpoint shape is one: a bare id (what the CRD once said) is refused
        {"phase": "Ready", "lastCheckpoint": "final-20260101T000000Z"},
        {"phase": "Ready", "lastCheckpoint": {"id": 3, "checkpoints": []}},
        {"phase": "Ready", "checkpointRequest": {"id": "request-1", "state": "Done"}},
        {"phase": "Ready", "readyShards": 1, "shards": []},
    ],
)
def test_bad_status_changes_nothing(users: Users, status: dict[str, Any]) -> None:
    before = users.row()
    r = users.put_status(status)
    assert r.status_code == 422
    assert users.row() == before


def checkpoint(request_id: int, state: str, **fields: Any) -> dict[str, Any]:
    """A reported checkpoint request (recstore.core.checkpoint_status.TableCheckpoint)."""
    return {"id": f"request-{request_id}", "requestId": request_id, "state": state, **fields}


SAVED = [
    {"index": 0, "endpoint": "127.0.0.1:5001", "rows": 40, "bytes": 640, "error": None},
    {"index": 1, "endpoint": "127.0.0.1:6001", "rows": 60, "bytes": 960, "error": None},
]


def test_checkpoint_request_running_then_completed(users: Users) -> None:
    checkpoints = f"/api/v1/tables/{users.table}/checkpoints"
    r = users.client.post(checkpoints, json={"note": "before retrain"}, headers=users.admin)
    assert r.status_code == 202
    asked = r.json()
    assert asked["state"] == "Requested" and asked["table"] == users.table
    later = users.client.post(checkpoints, headers=users.admin).json()
    listed = users.read(checkpoints)
    assert listed["total"] == 2 and listed["items"][1]["id"] == asked["id"]

    users.put_status({"phase": "Ready", "checkpointRequest": checkpoint(asked["id"], "Running")})
    (running,) = users.read(f"{checkpoints}?state=Running")["items"]
    assert running["id"] == asked["id"] and running["completed_at"] is None

    done = checkpoint(asked["id"], "Completed", at="2026-01-01T00:00:00Z", shards=SAVED)
    assert users.put_status({"phase": "Ready", "lastCheckpoint": done,
                             "checkpointRequest": done}).status_code == 200  # fmt: skip
    (completed,) = users.read(f"{checkpoints}?state=Completed")["items"]
    assert completed["id"] == asked["id"] and completed["completed_at"] is not None
    result = completed["detail"]["result"]
    assert completed["detail"]["note"] == "before retrain"
    assert [(s["index"], s["rows"]) for s in result["shards"]] == [(0, 40), (1, 60)]
    status = users.row()["status"]
    assert status["lastCheckpoint"] == status["checkpointRequest"] == {
        "message": None, **done
    }  # fmt: skip
    # the one asked after it was not touched: its turn comes
    assert users.read(checkpoints)["items"][0] == later

    again = users.put_status({"phase": "Ready", "checkpointRequest": done}).json()
    assert again["status"]["checkpointRequest"]["state"] == "Completed"
    assert users.read(f"{checkpoints}?state=Completed")["items"] == [completed]  # unchanged


def test_a_failed_checkpoint_request_fails_its_record_with_the_reason(users: Users) -> None:
    checkpoints = f"/api/v1/tables/{users.table}/checkpoints"
    asked = users.client.post(checkpoints, headers=users.admin).json()
    reason = "shard 1 (127.0.0.1:6001): UNAVAILABLE: disk busy"
    shards = [
        SAVED[0],
        {"index": 1, "endpoint": "127.0.0.1:6001", "error": "UNAVAILABLE: disk busy"},
    ]
    failed = checkpoint(asked["id"], "Failed", message=reason, at="2026-01-01T00:00:00Z",
                        shards=shards)  # fmt: skip
    users.put_status({"phase": "Ready", "checkpointRequest": failed})
    (record,) = users.read(f"{checkpoints}?state=Failed")["items"]
    assert record["id"] == asked["id"] and record["completed_at"] is not None
    assert record["detail"]["result"]["message"] == reason
    assert record["detail"]["result"]["shards"][1]["error"] == "UNAVAILABLE: disk busy"
    assert users.row()["status"]["lastCheckpoint"] is None  # a failed one is no checkpoint


def test_requests_the_provisioner_never_took_fail_once_a_later_one_is_reported(
    users: Users,
) -> None:
    """A provisioner takes one request at a time, in order: one still Requested when a later
    one is reported was lost (e.g. asked while no provisioner ran), and says so."""
    checkpoints = f"/api/v1/tables/{users.table}/checkpoints"
    lost = users.client.post(checkpoints, headers=users.admin).json()
    taken = users.client.post(checkpoints, headers=users.admin).json()
    users.put_status({"phase": "Ready", "checkpointRequest": checkpoint(taken["id"], "Running")})
    (record,) = users.read(f"{checkpoints}?state=Failed")["items"]
    assert record["id"] == lost["id"]
    assert record["detail"]["result"]["message"] == (
        f"never taken: the provisioner took checkpoint {taken['id']}, asked after it"
    )


def test_a_checkpoint_request_of_another_table_is_left_alone(users: Users) -> None:
    spec = {"name": "other", "numEmbeddings": 10, "embeddingDim": 2}
    assert users.client.post("/api/v1/tables", json=spec, headers=users.admin).status_code == 201
    theirs = users.client.post("/api/v1/tables/other/checkpoints", headers=users.admin).json()
    done = checkpoint(theirs["id"], "Completed", at="2026-01-01T00:00:00Z", shards=SAVED)
    assert users.put_status({"phase": "Ready", "checkpointRequest": done}).status_code == 200
    assert users.read("/api/v1/tables/other/checkpoints")["items"][0]["state"] == "Requested"


def test_the_reconcile_cores_status_round_trips_through_the_admin_api(users: Users) -> None:
    """What a provisioner computes (recstore.core.reconcile) is what the admin API serves."""
    for shard in (0, 1):
        users.register(shard, 5001 + 1000 * shard)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    saved = [ShardCheckpoint(index=0, endpoint="127.0.0.1:5001", rows=4, bytes=32),
             ShardCheckpoint(index=1, endpoint="127.0.0.1:6001", rows=6, bytes=48)]  # fmt: skip
    done = outcome("final-20260101T000000Z", saved, now=now)
    asked = users.client.post(f"/api/v1/tables/{users.table}/checkpoints", headers=users.admin)
    refused = ShardCheckpoint(index=1, endpoint="127.0.0.1:6001", error="UNAVAILABLE: refused")
    request_id = asked.json()["id"]
    failed = outcome(f"request-{request_id}", [saved[0], refused], now=now, request_id=request_id)
    shards = tuple(ShardState(i, f"127.0.0.1:{5001 + 1000 * i}", i == 0) for i in range(2))
    status = compute_status(
        problem=None, declared_shards=2, generation=1, previous=None, now=now,
        observation=Observation(2, False, shards, last_checkpoint=done, checkpoint_request=failed),
    )  # fmt: skip
    r = users.put_status(status.to_wire())
    assert r.status_code == 200, r.text
    assert TableStatus.model_validate(users.row()["status"]) == status


def test_events_filter_and_paginate(users: Users, tokens: dict[str, str]) -> None:
    editor = {"Authorization": f"Bearer {tokens['editor']}"}
    users.client.post(f"/api/v1/tables/{users.table}/checkpoints", headers=editor)
    users.client.patch(f"/api/v1/tables/{users.table}", json={"shards": 3}, headers=editor)
    mine = users.read("/api/v1/events?actor=editor-user (token 2)")
    assert [e["action"] for e in mine["items"]] == ["table.update", "checkpoint.request"]
    by_table = users.read(f"/api/v1/events?table={users.table}&limit=1&offset=1")
    assert by_table["total"] == 3 and len(by_table["items"]) == 1
    assert by_table["items"][0]["action"] == "checkpoint.request"


def test_deleting_a_table_removes_its_nodes_and_checkpoints(users: Users) -> None:
    client, table, admin = users.client, users.table, users.admin
    users.register(0, 5001)
    client.post(f"/api/v1/tables/{table}/checkpoints", headers=admin)
    assert client.delete(f"/api/v1/tables/{table}", headers=admin).status_code == 204
    assert users.read("/api/v1/nodes")["total"] == 0
    node_delete = client.delete("/api/v1/nodes/1", headers=admin)
    assert node_delete.status_code == 404


def test_every_change_names_its_resource_in_the_audit_log(users: Users) -> None:
    client, table, admin = users.client, users.table, users.admin
    node = users.register(0, 5001)
    beat = f"/api/v1/nodes/{node['id']}/heartbeat"
    client.post(beat, json={"ready": True}, headers=users.provisioner)
    client.post(beat, json={"ready": False}, headers=users.provisioner)
    checkpoint = client.post(f"/api/v1/tables/{table}/checkpoints", headers=admin).json()
    users.put_status({"phase": "Ready"})
    client.patch(f"/api/v1/tables/{table}", json={"optimizer": {"lr": 0.5}}, headers=admin)
    token = client.post("/api/v1/tokens", json={"name": "ci"}, headers=admin).json()
    client.delete(f"/api/v1/tokens/{token['id']}", headers=admin)
    client.delete(f"/api/v1/nodes/{node['id']}", headers=admin)
    client.delete(f"/api/v1/tables/{table}", headers=admin)
    events = users.read("/api/v1/events?limit=500")["items"]
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


def test_a_shrink_forgets_the_removed_shards_node_once_nothing_names_it(users: Users) -> None:
    """2 -> 3 -> 2: shard 2's node counts while the spec or the slot map names it, and is
    deleted (audited) by the status report after which neither does."""
    client, admin = users.client, users.admin

    def status(slot_map: SlotMap, shards: int) -> dict[str, Any]:
        return {
            "phase": "Ready",
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllShardsReady"}],
            "observedGeneration": 1,
            "shards": [
                {"index": i, "endpoint": f"127.0.0.1:{5001 + 1000 * i}", "ready": True}
                for i in range(shards)
            ],
            "slotMap": slot_map.to_dict(),
            "lastCheckpoint": None,
        }

    def beat(node: dict[str, Any], rows: int) -> None:
        r = client.post(f"/api/v1/nodes/{node['id']}/heartbeat", headers=users.provisioner,
                        json={"ready": True, "rows": rows, "memory_bytes": rows})  # fmt: skip
        assert r.status_code == 200, r.text

    nodes = [users.register(0, 5001), users.register(1, 6001)]
    grow = client.patch(f"/api/v1/tables/{users.table}", json={"shards": 3}, headers=admin)
    assert grow.status_code == 200, grow.text
    nodes.append(users.register(2, 7001))
    for node in nodes:
        beat(node, 10)
    three = SlotMap.initial(3)
    assert users.put_status(status(three, 3)).status_code == 200
    shrink = client.patch(f"/api/v1/tables/{users.table}", json={"shards": 2}, headers=admin)
    assert shrink.status_code == 200, shrink.text
    moving = users.put_status(status(three, 3))  # the map still names shard 2: kept
    assert moving.status_code == 200 and moving.json()["rows"] == 30
    two = SlotMap(epoch=three.epoch + 1, ranges=SlotMap.initial(2).ranges)
    done = users.put_status(status(two, 2))
    assert done.status_code == 200, done.text
    assert done.json()["rows"] == 20 and users.row()["rows"] == 20
    assert [n["shard_index"] for n in users.read("/api/v1/nodes")["items"]] == [0, 1]
    deleted = [e for e in users.read(f"/api/v1/events?table={users.table}")["items"]
               if e["action"] == "node.delete"]  # fmt: skip
    assert [e["resource_name"] for e in deleted] == [f"{users.table}/2"]
    registered = [e for e in users.read(f"/api/v1/events?table={users.table}")["items"]
                  if e["action"] == "node.register"]  # fmt: skip
    assert deleted[0]["actor"] == registered[0]["actor"]  # the provisioner's report did it
