"""Dashboard forms refuse forged posts; logging out (or revoking the token) ends the session.

Forged requests are sent with httpx (TestClient) as another site would make a
browser send them: the victim's cookie, and either no CSRF token or a foreign
Origin. The browser-driven forms are in test_dashboard_browser.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from .conftest import dashboard_login

SESSION_COOKIE = "recstore_session"
FORM = {"name": "forged", "num_embeddings": "10", "embedding_dim": "4", "lr": "0.1"}


def _tables(client: TestClient, headers: dict[str, str]) -> list[str]:
    return [t["name"] for t in client.get("/api/v1/tables", headers=headers).json()["items"]]


@pytest.mark.parametrize(
    ("extra", "headers"),
    [
        ({}, {}),  # no token at all
        ({"csrf_token": "guessed"}, {}),
        ("valid", {"Origin": "http://evil.example"}),
        ("valid", {"Referer": "http://evil.example/page"}),
        ("valid", {"Origin": "null"}),
    ],
    ids=["no-token", "wrong-token", "foreign-origin", "foreign-referer", "opaque-origin"],
)
def test_forged_create_table_is_refused(
    client: TestClient,
    admin_headers: dict[str, str],
    extra: Any,
    headers: dict[str, str],
) -> None:
    csrf = dashboard_login(client, admin_headers["Authorization"].split()[1])
    fields = {**FORM, "csrf_token": csrf} if extra == "valid" else {**FORM, **extra}
    r = client.post("/ui/tables", data=fields, headers=headers, follow_redirects=False)
    assert r.status_code == 403, r.text
    assert _tables(client, admin_headers) == []
    events = client.get("/api/v1/events", headers=admin_headers).json()
    assert events["total"] == 0


@pytest.mark.parametrize(
    "origin",
    ["http://testserver", "https://testserver"],  # https: the browser's view behind a TLS proxy
)
def test_form_with_the_sessions_token_and_own_origin_works(
    client: TestClient, admin_headers: dict[str, str], origin: str
) -> None:
    csrf = dashboard_login(client, admin_headers["Authorization"].split()[1])
    r = client.post(
        "/ui/tables",
        data={**FORM, "csrf_token": csrf},
        headers={"Origin": origin},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/ui/tables/forged"
    assert _tables(client, admin_headers) == ["forged"]


def test_forged_checkpoint_and_logout_are_refused(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    spec = {"name": "t", "numEmbeddings": 10, "embeddingDim": 4}
    client.post("/api/v1/tables", json=spec, headers=admin_headers)
    dashboard_login(client, admin_headers["Authorization"].split()[1])
    assert client.post("/ui/tables/t/checkpoints", follow_redirects=False).status_code == 403
    listed = client.get("/api/v1/tables/t/checkpoints", headers=admin_headers).json()
    assert listed["total"] == 0
    assert client.post("/ui/logout", follow_redirects=False).status_code == 403
    assert client.get("/ui/", follow_redirects=False).status_code == 200  # still logged in


def test_session_cookie_is_not_the_token_and_is_strict(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    secret = admin_headers["Authorization"].split()[1]
    r = client.post("/ui/login", data={"token": secret}, follow_redirects=False)
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert secret not in cookie and client.cookies[SESSION_COOKIE] != secret


def test_logout_revokes_the_session_even_when_the_cookie_is_replayed(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    csrf = dashboard_login(client, admin_headers["Authorization"].split()[1])
    stolen = client.cookies[SESSION_COOKIE]
    r = client.post("/ui/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    client.cookies.set(SESSION_COOKIE, stolen)  # replayed
    r = client.get("/ui/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    r = client.post("/ui/tables", data={**FORM, "csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert _tables(client, admin_headers) == []


def test_revoking_the_token_ends_its_sessions(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    created = client.post(
        "/api/v1/tokens", json={"name": "ui", "role": "viewer"}, headers=admin_headers
    ).json()
    dashboard_login(client, created["token"])
    assert client.get("/ui/", follow_redirects=False).status_code == 200
    client.delete(f"/api/v1/tokens/{created['id']}", headers=admin_headers)
    assert client.get("/ui/", follow_redirects=False).status_code == 303


def test_cross_origin_login_is_refused(client: TestClient, admin_headers: dict[str, str]) -> None:
    r = client.post(
        "/ui/login",
        data={"token": admin_headers["Authorization"].split()[1]},
        headers={"Origin": "http://evil.example"},
        follow_redirects=False,
    )
    assert r.status_code == 403 and "set-cookie" not in r.headers
