"""The auth matrix (every route x no token / each role) and token handling."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from recstore.admin import Settings, create_app
from recstore.core.reshard.events import ReshardEvent, ReshardMoment
from recstore.core.reshard.plan import ReshardJob
from recstore.core.routing import SlotMap

ROLES = ("viewer", "editor", "admin", "provisioner")
#: Who may call a route guarded by each role: the ranked ladder, and the provisioner apart.
ALLOWED = {
    "viewer": set(ROLES),
    "editor": {"editor", "admin"},
    "admin": {"admin"},
    "provisioner": {"provisioner"},
}
SPEC = {"name": "auth_t", "numEmbeddings": 10, "embeddingDim": 4, "shards": 1}
NODE = {"table": "auth_t", "shard_index": 0, "endpoint": "127.0.0.1:5000"}
MOVE = ReshardEvent.of(ReshardMoment.started, ReshardJob.start("auth_t", SlotMap.initial(1), 2), 1)

RECOVERY = {
    "table": "auth_t",
    "accept_log_loss": False,
    "shards": [{"shard": 0, "endpoint": "127.0.0.1:5000", "outcome": "recovered"}],
}

#: (method, path template, the role guarding it, a valid body). Every /api/v1 route is here:
#: test_matrix_covers_every_route fails when a route is added without its row.
ROUTES: list[tuple[str, str, str, Any]] = [
    ("GET", "/api/v1/tables", "viewer", None),
    ("POST", "/api/v1/tables", "editor", {**SPEC, "name": "made_{role}"}),
    ("GET", "/api/v1/tables/{name}", "viewer", None),
    ("PATCH", "/api/v1/tables/{name}", "editor", {"optimizer": {"lr": 0.5}}),
    ("DELETE", "/api/v1/tables/{name}", "editor", None),
    ("PUT", "/api/v1/tables/{name}/status", "provisioner", {"phase": "Ready"}),
    ("GET", "/api/v1/tables/{name}/discovery", "viewer", None),
    ("GET", "/api/v1/tables/{name}/cache", "viewer", None),
    ("POST", "/api/v1/tables/{name}/resharding-events", "provisioner", MOVE.to_json()),
    ("GET", "/api/v1/tables/{name}/checkpoints", "viewer", None),
    ("POST", "/api/v1/tables/{name}/checkpoints", "editor", {"note": "x"}),
    ("POST", "/api/v1/tables/{name}/recoveries", "editor", RECOVERY),
    ("GET", "/api/v1/pools", "viewer", None),
    ("POST", "/api/v1/pools", "editor", {"name": "made-{role}", "shards": 2}),
    ("GET", "/api/v1/pools/{name}", "viewer", None),
    ("PATCH", "/api/v1/pools/{name}", "editor", {"placement": {"resources": {"memory": "4Gi"}}}),
    ("DELETE", "/api/v1/pools/{name}", "editor", None),
    ("PUT", "/api/v1/pools/{name}/status", "provisioner", {"phase": "Ready"}),
    ("GET", "/api/v1/nodes", "viewer", None),
    ("POST", "/api/v1/nodes", "provisioner", NODE),
    ("GET", "/api/v1/nodes/{node_id}", "viewer", None),
    ("POST", "/api/v1/nodes/{node_id}/heartbeat", "provisioner", {"ready": True, "rows": 1}),
    ("DELETE", "/api/v1/nodes/{node_id}", "admin", None),
    ("GET", "/api/v1/events", "viewer", None),
    ("GET", "/api/v1/tokens", "admin", None),
    ("POST", "/api/v1/tokens", "admin", {"name": "new-token", "role": "viewer"}),
    ("DELETE", "/api/v1/tokens/{token_id}", "admin", None),
]


def test_matrix_covers_every_route(app: FastAPI) -> None:
    documented = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if path.startswith("/api/v1")
        for method in operations
    }
    assert documented == {(m, p) for m, p, _, _ in ROUTES}


def _fill(path: str, ids: dict[str, Any]) -> str:
    return path.format(**ids)


@pytest.mark.parametrize(
    ("method", "path", "guard", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _, _ in ROUTES]
)
def test_auth_matrix(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    tokens: dict[str, str],
    method: str,
    path: str,
    guard: str,
    body: Any,
) -> None:
    assert client.post("/api/v1/tables", json=SPEC, headers=admin_headers).status_code == 201
    pool = {"name": "auth-pool", "shards": 1}
    assert client.post("/api/v1/pools", json=pool, headers=admin_headers).status_code == 201
    node = client.post("/api/v1/nodes", json=NODE, headers=provisioner_headers).json()
    victim = client.post(
        "/api/v1/tokens", json={"name": "victim", "role": "viewer"}, headers=admin_headers
    ).json()
    name = "auth-pool" if path.startswith("/api/v1/pools/") else "auth_t"
    url = _fill(path, {"name": name, "node_id": node["id"], "token_id": victim["id"]})

    def call(headers: dict[str, str], role: str) -> int:
        payload = body
        if isinstance(body, dict) and "name" in body and "{role}" in str(body["name"]):
            payload = {**body, "name": body["name"].format(role=role)}
        return client.request(method, url, json=payload, headers=headers).status_code

    assert call({}, "anonymous") == 401
    assert call({"Authorization": "Bearer rs_not-a-real-token"}, "bogus") == 401
    allowed_seen = False
    for role in ROLES:
        status = call({"Authorization": f"Bearer {tokens[role]}"}, role)
        if role not in ALLOWED[guard]:
            assert status == 403, (role, status)
        elif not allowed_seen:
            assert 200 <= status < 300, (role, status)  # the first allowed call really succeeds
            allowed_seen = True
        else:
            assert status not in (401, 403), (role, status)


def test_forbidden_call_writes_nothing(
    client: TestClient, admin_headers: dict[str, str], tokens: dict[str, str]
) -> None:
    viewer = {"Authorization": f"Bearer {tokens['viewer']}"}
    assert client.post("/api/v1/tables", json=SPEC, headers=viewer).status_code == 403
    assert client.get("/api/v1/tables", headers=admin_headers).json()["total"] == 0
    assert (
        client.get("/api/v1/events?action=table.create", headers=admin_headers).json()["total"] == 0
    )


def test_secret_is_shown_once_and_stored_hashed(
    client: TestClient, admin_headers: dict[str, str], app: FastAPI
) -> None:
    created = client.post(
        "/api/v1/tokens", json={"name": "ci", "role": "editor"}, headers=admin_headers
    ).json()
    secret = created["token"]
    assert secret.startswith("rs_") and len(secret) > 40 and created["prefix"] == secret[:9]
    listing = client.get("/api/v1/tokens", headers=admin_headers).text
    assert secret not in listing and "token_hash" not in listing
    events = client.get("/api/v1/events", headers=admin_headers).text
    assert secret not in events
    from sqlalchemy import text

    with app.state.context.engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash FROM tokens")).scalars().all()
    assert secret not in stored and all(len(h) == 64 for h in stored)


def test_revoked_token_is_rejected(client: TestClient, admin_headers: dict[str, str]) -> None:
    created = client.post(
        "/api/v1/tokens", json={"name": "temp", "role": "admin"}, headers=admin_headers
    ).json()
    headers = {"Authorization": f"Bearer {created['token']}"}
    assert client.get("/api/v1/tables", headers=headers).status_code == 200
    assert (
        client.delete(f"/api/v1/tokens/{created['id']}", headers=admin_headers).status_code == 204
    )
    r = client.get("/api/v1/tables", headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    listed = client.get("/api/v1/tokens?include_revoked=true", headers=admin_headers).json()
    assert [t["revoked_at"] is not None for t in listed["items"]] == [True]
    assert client.get("/api/v1/tokens", headers=admin_headers).json()["total"] == 0


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "bootstrap-admin-secret"])
def test_malformed_authorization_is_401(client: TestClient, header: str) -> None:
    assert client.get("/api/v1/tables", headers={"Authorization": header}).status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        {"name": "", "role": "viewer"},
        {"name": "x", "role": "root"},
        {"name": "x", "role": "viewer", "secret": "mine"},
    ],
)
def test_bad_token_requests_are_422(
    client: TestClient, admin_headers: dict[str, str], body: dict[str, Any]
) -> None:
    assert client.post("/api/v1/tokens", json=body, headers=admin_headers).status_code == 422
    assert client.get("/api/v1/tokens", headers=admin_headers).json()["total"] == 0


def test_bootstrap_token_from_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text("from-a-mounted-secret\n")
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'a.db'}", bootstrap_token_file=secret_file
    )
    with TestClient(create_app(settings)) as client:
        ok = client.get("/api/v1/tables", headers={"Authorization": "Bearer from-a-mounted-secret"})
        assert ok.status_code == 200
        assert (
            client.get("/api/v1/tables", headers={"Authorization": "Bearer x"}).status_code == 401
        )


def test_no_bootstrap_means_no_implicit_admin(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}")
    with TestClient(create_app(settings)) as client:
        assert client.get("/api/v1/tables", headers={"Authorization": "Bearer "}).status_code == 401


def test_secrets_never_reach_the_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bootstrap = "bootstrap-secret-value-0123456789"
    caplog.set_level(logging.DEBUG)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'a.db'}", bootstrap_token=SecretStr(bootstrap)
    )
    with TestClient(create_app(settings)) as client:
        headers = {"Authorization": f"Bearer {bootstrap}"}
        created = client.post(
            "/api/v1/tokens", json={"name": "n", "role": "editor"}, headers=headers
        ).json()
        client.get("/api/v1/tables", headers={"Authorization": f"Bearer {created['token']}"})
        client.post("/ui/login", data={"token": created["token"]}, follow_redirects=False)
    assert caplog.records  # the service did log something
    assert bootstrap not in caplog.text and created["token"] not in caplog.text
