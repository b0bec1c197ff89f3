"""Table CRUD through the API on SQLite and PostgreSQL: create, list, get, patch, delete."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from recstore.core import SlotMap, TableSpec

SPEC = {"name": "clicks", "numEmbeddings": 1000, "embeddingDim": 16, "shards": 2}


def create(client: TestClient, headers: dict[str, str], **overrides: Any) -> dict[str, Any]:
    r = client.post("/api/v1/tables", json={**SPEC, **overrides}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def register_nodes(client: TestClient, headers: dict[str, str], endpoints: list[str]) -> None:
    """The provisioner registers the node of each shard (status may only name these)."""
    for index, endpoint in enumerate(endpoints):
        body = {"table": "clicks", "shard_index": index, "endpoint": endpoint}
        assert client.post("/api/v1/nodes", json=body, headers=headers).status_code in (200, 201)


def snapshot(client: TestClient, headers: dict[str, str]) -> tuple[Any, Any]:
    """Everything a rejected request must leave untouched: tables and the audit log."""
    tables = client.get("/api/v1/tables?limit=500", headers=headers).json()
    events = client.get("/api/v1/events?limit=500", headers=headers).json()
    return tables, events["total"]


def test_create_get_list_delete(client: TestClient, admin_headers: dict[str, str]) -> None:
    body = create(client, admin_headers)
    assert body["spec"] == TableSpec.model_validate(SPEC).to_wire()
    assert body["status"]["phase"] == "Pending"  # no provisioner attached
    assert body["resource_version"] == 1 and body["generation"] == 1
    assert body["created_by"] == "bootstrap-admin"

    r = client.get("/api/v1/tables/clicks", headers=admin_headers)
    assert r.status_code == 200 and r.headers["etag"] == '"1"'
    assert r.json()["spec"]["embeddingDim"] == 16

    listed = client.get("/api/v1/tables", headers=admin_headers).json()
    assert [t["name"] for t in listed["items"]] == ["clicks"] and listed["total"] == 1

    assert client.delete("/api/v1/tables/clicks", headers=admin_headers).status_code == 204
    assert client.get("/api/v1/tables/clicks", headers=admin_headers).status_code == 404
    actions = [
        e["action"] for e in client.get("/api/v1/events", headers=admin_headers).json()["items"]
    ]
    assert actions[:2] == ["table.delete", "table.create"]


def test_snake_case_spec_is_accepted(client: TestClient, admin_headers: dict[str, str]) -> None:
    snake = {
        "name": "snake",
        "num_embeddings": 5,
        "embedding_dim": 3,
        "optimizer": {"kind": "adam", "weight_decay": 0.1},
    }
    r = client.post("/api/v1/tables", json=snake, headers=admin_headers)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["spec"]["optimizer"]["weightDecay"] == 0.1
    assert body["spec"]["numEmbeddings"] == 5 and body["spec"]["embeddingDim"] == 3


@pytest.mark.parametrize("given", [{}, {"nonFinite": "skip-rows"}, {"non_finite": "allow"}])
def test_the_non_finite_policy_is_stored_and_returned(
    client: TestClient, admin_headers: dict[str, str], given: dict[str, Any]
) -> None:
    body = create(client, admin_headers, **given)
    want = next(iter(given.values()), "reject")
    assert body["spec"]["nonFinite"] == want
    r = client.get("/api/v1/tables/clicks", headers=admin_headers)
    assert r.json()["spec"]["nonFinite"] == want


@pytest.mark.parametrize("given", [{}, {"mode": "inference"}, {"mode": "training"}])
def test_the_mode_is_stored_and_returned(
    client: TestClient, admin_headers: dict[str, str], given: dict[str, Any]
) -> None:
    body = create(client, admin_headers, **given)
    want = given.get("mode", "training")
    assert body["spec"]["mode"] == want
    r = client.get("/api/v1/tables/clicks", headers=admin_headers)
    assert r.json()["spec"]["mode"] == want


def test_list_pagination_and_filters(
    client: TestClient, admin_headers: dict[str, str], provisioner_headers: dict[str, str]
) -> None:
    for i in range(7):
        create(client, admin_headers, name=f"t{i}", shards=1)
    create(client, admin_headers, name="other", shards=1)
    client.put("/api/v1/tables/t3/status", json={"phase": "Ready"}, headers=provisioner_headers)

    page = client.get("/api/v1/tables?limit=3&offset=2", headers=admin_headers).json()
    assert [t["name"] for t in page["items"]] == ["t1", "t2", "t3"]
    assert page["total"] == 8 and page["limit"] == 3 and page["offset"] == 2
    prefixed = client.get("/api/v1/tables?name_prefix=t&limit=500", headers=admin_headers).json()
    assert prefixed["total"] == 7
    ready = client.get("/api/v1/tables?phase=Ready", headers=admin_headers).json()
    assert [t["name"] for t in ready["items"]] == ["t3"]
    # '_' is a LIKE wildcard: a prefix filter must match it literally.
    assert client.get("/api/v1/tables?name_prefix=t_", headers=admin_headers).json()["total"] == 0


def test_duplicate_name_is_409_and_changes_nothing(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    create(client, admin_headers)
    before = snapshot(client, admin_headers)
    r = client.post("/api/v1/tables", json={**SPEC, "embeddingDim": 4}, headers=admin_headers)
    assert r.status_code == 409 and "already exists" in r.json()["detail"]
    assert snapshot(client, admin_headers) == before


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({**SPEC, "name": "Bad Name"}, "pattern"),
        ({**SPEC, "embeddingDim": 0}, "greater than or equal to 1"),
        ({**SPEC, "dtype": "int8"}, "float32"),
        ({**SPEC, "shards": 0}, "greater than or equal to 1"),
        ({**SPEC, "optimizer": {"kind": "adam", "lr": -1}}, "greater than 0"),
        ({**SPEC, "initializer": {"kind": "uniform", "low": 1, "high": 0}}, "low < high"),
        ({**SPEC, "keys": {"mode": "dense", "eviction": "lru"}}, "hashed keys only"),
        ({**SPEC, "colour": "blue"}, "Extra inputs are not permitted"),
        ({**SPEC, "nonFinite": "ignore"}, "'reject', 'skip-rows' or 'allow'"),
        ({**SPEC, "mode": "readonly"}, "'training' or 'inference'"),
        ({"name": "x"}, "Field required"),
    ],
)
def test_invalid_create_is_422_with_reason_and_writes_nothing(
    client: TestClient, admin_headers: dict[str, str], body: dict[str, Any], fragment: str
) -> None:
    before = snapshot(client, admin_headers)
    r = client.post("/api/v1/tables", json=body, headers=admin_headers)
    assert r.status_code == 422
    assert fragment in r.text
    assert snapshot(client, admin_headers) == before


def test_patch_with_etag_and_stale_version(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    create(client, admin_headers)
    r = client.patch(
        "/api/v1/tables/clicks",
        json={"optimizer": {"kind": "adagrad"}, "checkpoint": {"intervalSeconds": 60}},
        headers={**admin_headers, "If-Match": '"1"'},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["spec"]["optimizer"]["kind"] == "adagrad"
    assert body["spec"]["optimizer"]["lr"] == 0.01  # untouched fields kept
    assert body["spec"]["checkpoint"]["intervalSeconds"] == 60
    assert body["resource_version"] == 2 and body["generation"] == 2 and r.headers["etag"] == '"2"'

    before = snapshot(client, admin_headers)
    stale = client.patch(
        "/api/v1/tables/clicks", json={"shards": 3}, headers={**admin_headers, "If-Match": '"1"'}
    )
    assert stale.status_code == 409 and "resourceVersion 2" in stale.json()["detail"]
    stale_body = client.patch(
        "/api/v1/tables/clicks", json={"shards": 3, "resourceVersion": 1}, headers=admin_headers
    )
    assert stale_body.status_code == 409
    assert snapshot(client, admin_headers) == before

    event = client.get("/api/v1/events?action=table.update", headers=admin_headers).json()["items"][
        0
    ]
    assert event["before"]["spec"]["optimizer"]["kind"] == "sgd"
    assert event["after"]["spec"]["optimizer"]["kind"] == "adagrad"


def test_noop_patch_keeps_version(client: TestClient, admin_headers: dict[str, str]) -> None:
    create(client, admin_headers)
    r = client.patch("/api/v1/tables/clicks", json={"shards": 2}, headers=admin_headers)
    assert r.status_code == 200 and r.json()["resource_version"] == 1
    # every spec field may be sent, as a re-applied YAML sends it: unchanged is a no-op
    r = client.patch("/api/v1/tables/clicks", json={"mode": "training"}, headers=admin_headers)
    assert r.status_code == 200 and r.json()["resource_version"] == 1


@pytest.mark.parametrize(
    ("patch", "status", "fragment"),
    [
        ({"embeddingDim": 8}, 422, "embedding_dim cannot change"),
        ({"dtype": "float16"}, 422, "dtype cannot change"),
        ({"name": "renamed"}, 422, "name cannot change"),
        ({"keys": {"mode": "hashed"}}, 422, "keys.mode cannot change"),
        ({"optimizer": {"lr": 0}}, 422, "greater than 0"),
        ({"optimizer": {"learningRate": 1}}, 422, "Extra inputs"),
        ({"numEmbeddings": None}, 422, "Field required"),
        ({"shards": "many"}, 422, "integer"),
        ({"bogus": 1}, 422, "Extra inputs"),
        ({"mode": "inference"}, 422, "recstore restore --mode inference"),
    ],
)
def test_invalid_patch_changes_nothing(
    client: TestClient,
    admin_headers: dict[str, str],
    patch: dict[str, Any],
    status: int,
    fragment: str,
) -> None:
    create(client, admin_headers)
    before = snapshot(client, admin_headers)
    r = client.patch("/api/v1/tables/clicks", json=patch, headers=admin_headers)
    assert r.status_code == status, r.text
    assert fragment in r.text
    assert snapshot(client, admin_headers) == before


def test_bad_if_match_is_422(client: TestClient, admin_headers: dict[str, str]) -> None:
    create(client, admin_headers)
    r = client.patch(
        "/api/v1/tables/clicks",
        json={"shards": 3},
        headers={**admin_headers, "If-Match": "yesterday"},
    )
    assert r.status_code == 422 and "If-Match" in r.json()["detail"]


def test_shard_change_is_recorded_as_reshard(
    client: TestClient, admin_headers: dict[str, str], provisioner_headers: dict[str, str]
) -> None:
    create(client, admin_headers)
    r = client.patch("/api/v1/tables/clicks", json={"shards": 4}, headers=admin_headers)
    assert r.status_code == 200
    assert r.json()["spec"]["shards"] == 4 and r.json()["reshard_required"] is True
    event = client.get("/api/v1/events?action=table.update", headers=admin_headers).json()["items"][
        0
    ]
    assert event["after"]["reshardRequired"] == {"from": 2, "to": 4}
    # Data has not moved: the slot map still routes to the two running shards.
    register_nodes(client, provisioner_headers, ["a:1", "b:1"])
    client.put(
        "/api/v1/tables/clicks/status",
        json={
            "phase": "Ready",
            "shards": [
                {"index": 0, "endpoint": "a:1", "ready": True},
                {"index": 1, "endpoint": "b:1", "ready": True},
            ],
        },
        headers=provisioner_headers,
    )
    found = client.get("/api/v1/tables/clicks/discovery", headers=admin_headers).json()
    assert found["shards"] == 2 and found["slot_map"] == SlotMap.initial(2).to_dict()
    # The resharder reports the new map: the catalogue then agrees with the spec again.
    new_map = SlotMap.initial(4).to_dict() | {"epoch": 2}
    register_nodes(client, provisioner_headers, [f"n{i}:1" for i in range(4)])
    r = client.put(
        "/api/v1/tables/clicks/status",
        json={
            "phase": "Ready",
            "slotMap": new_map,
            "shards": [{"index": i, "endpoint": f"n{i}:1", "ready": True} for i in range(4)],
        },
        headers=provisioner_headers,
    )
    assert r.status_code == 200 and r.json()["reshard_required"] is False
    found = client.get("/api/v1/tables/clicks/discovery", headers=admin_headers).json()
    assert found["endpoints"] == ["n0:1", "n1:1", "n2:1", "n3:1"]
    assert found["slot_map"]["epoch"] == 2


def test_delete_with_stale_if_match_is_409(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    create(client, admin_headers)
    client.patch("/api/v1/tables/clicks", json={"shards": 3}, headers=admin_headers)
    r = client.delete("/api/v1/tables/clicks", headers={**admin_headers, "If-Match": '"1"'})
    assert r.status_code == 409
    assert client.get("/api/v1/tables/clicks", headers=admin_headers).status_code == 200


def test_unknown_table_is_404(client: TestClient, admin_headers: dict[str, str]) -> None:
    for method, path in [("GET", ""), ("PATCH", ""), ("DELETE", ""), ("GET", "/discovery")]:
        kwargs: dict[str, Any] = {"json": {}} if method == "PATCH" else {}
        r = client.request(method, f"/api/v1/tables/nope{path}", headers=admin_headers, **kwargs)
        assert r.status_code == 404 and "nope" in r.json()["detail"]
