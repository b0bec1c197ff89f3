"""Non-finite numbers and deep nesting: every JSON body of the API answers 422, changing nothing.

``NaN``, ``Infinity``, ``-Infinity`` and ``1e400`` (which Python reads as
infinity) are not JSON numbers a table may hold; nested arrays deeper than
recursion allows end a parse in RecursionError. Each is refused while the body
is parsed, on every route that takes one (found in the OpenAPI document, so a
new route is covered too); a finite spec with a non-finite value given another
way (the dashboard's form) is refused naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from recstore.core.strict_json import MAX_DEPTH

from .conftest import dashboard_login

SPEC = '{"name": "clicks", "numEmbeddings": 10, "embeddingDim": 4, %s}'
BODIES = {
    "NaN": (SPEC % '"optimizer": {"kind": "sgd", "lr": NaN}', "NaN is not a JSON number"),
    "Infinity": (SPEC % '"initializer": {"std": Infinity}', "Infinity is not a JSON number"),
    "-Infinity": (SPEC % '"initializer": {"mean": -Infinity}', "-Infinity is not a JSON number"),
    "1e400": (SPEC % '"optimizer": {"weightDecay": 1e400}', "1e400 is out of range"),
    "deep": ("[" * 100_000 + "]" * 100_000, "nested 100000 levels deep"),
    "just too deep": (
        "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
        f"nested {MAX_DEPTH + 1} levels deep, more than the {MAX_DEPTH} accepted",
    ),
}
PATH_VALUES = {"name": "kept", "node_id": "1", "token_id": "1", "checkpoint_id": "1"}


def _json_routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path) of every operation that takes a JSON body."""
    routes = []
    for path, operations in client.get("/openapi.json").json()["paths"].items():
        for method, operation in operations.items():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                routes.append((method.upper(), path.format(**PATH_VALUES)))
    return routes


def _everything(client: TestClient, headers: dict[str, str]) -> tuple[Any, ...]:
    return tuple(
        client.get(f"/api/v1/{what}?limit=500", headers=headers).json()
        for what in ("tables", "events", "nodes", "tokens")
    )


@pytest.mark.parametrize("case", list(BODIES))
def test_every_json_body_refuses_non_finite_numbers_and_deep_nesting(
    client: TestClient, admin_headers: dict[str, str], case: str
) -> None:
    kept = {"name": "kept", "numEmbeddings": 10, "embeddingDim": 4}
    assert client.post("/api/v1/tables", json=kept, headers=admin_headers).status_code == 201
    before = _everything(client, admin_headers)
    routes = _json_routes(client)
    assert ("POST", "/api/v1/tables") in routes and ("PATCH", "/api/v1/tables/kept") in routes
    body, reason = BODIES[case]
    headers = {**admin_headers, "Content-Type": "application/json"}
    for method, path in routes:
        reply = client.request(method, path, content=body, headers=headers)
        assert reply.status_code == 422, (method, path, reply.status_code, reply.text)
        (error,) = reply.json()["detail"]
        assert error["type"] == "json_invalid" and reason in error["ctx"]["error"], error
    assert _everything(client, admin_headers) == before


def test_a_finite_body_at_the_nesting_limit_still_parses(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    """Bounded, not banned: a spec nested up to the limit reaches validation."""
    nested = "[" * (MAX_DEPTH - 2) + "1" + "]" * (MAX_DEPTH - 2)  # in the spec and optimizer
    body = SPEC % f'"optimizer": {{"lr": {nested}}}'
    r = client.post("/api/v1/tables", content=body, headers={**admin_headers,
                    "Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "optimizer", "lr"] and error["type"] == "float_type"


@pytest.mark.parametrize("lr", ["nan", "inf", "-inf", "1e400"])
def test_the_dashboard_form_refuses_a_non_finite_rate_naming_it(
    client: TestClient, admin_headers: dict[str, str], lr: str
) -> None:
    csrf = dashboard_login(client, admin_headers["Authorization"].split()[1])
    form = {"name": "formed", "num_embeddings": "10", "embedding_dim": "4", "lr": lr}
    r = client.post("/ui/tables", data={**form, "csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 200 and "optimizer.lr: Input should be a finite number" in r.text
    assert client.get("/api/v1/tables", headers=admin_headers).json()["total"] == 0
