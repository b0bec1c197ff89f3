"""A write that loses a race to another writer (the provisioner's status reports, every
poll): without a version of its own it is taken against the newest; with a stale
If-Match it answers 409, nothing written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from recstore.admin import crud

TABLE = {"name": "clicks", "numEmbeddings": 100, "embeddingDim": 8}
POOL = {"name": "shared", "shards": 2}


def racing(monkeypatch: pytest.MonkeyPatch, name: str, sql_table: str) -> list[int]:
    """Before the first call of ``crud.<name>`` writes, another writer bumps the row's
    version (and commits), as a status report does; returns the calls made."""
    original: Callable[..., Any] = getattr(crud, name)
    calls: list[int] = []

    def raced(session: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            with session.get_bind().engine.begin() as other:
                other.execute(sa.text(
                    f"UPDATE {sql_table} SET resource_version = resource_version + 1"
                ))  # fmt: skip
        return original(session, **kwargs)

    monkeypatch.setattr(crud, name, raced)
    return calls


@pytest.mark.parametrize(
    ("method", "path", "body", "crud_name", "sql_table", "ok"),
    [
        ("DELETE", "/api/v1/tables/clicks", None, "delete_table", "tables", 204),
        ("PATCH", "/api/v1/tables/clicks", {"optimizer": {"kind": "sgd", "lr": 0.5}},
         "patch_table", "tables", 200),
        ("PATCH", "/api/v1/pools/shared", {"placement": {"resources": {"memory": "3Gi"}}},
         "patch_pool", "pools", 200),
        ("DELETE", "/api/v1/pools/shared", None, "delete_pool", "pools", 204),
    ],
)  # fmt: skip
def test_a_write_without_a_version_is_taken_against_the_newest(
    client: TestClient, admin_headers: dict[str, str], monkeypatch: pytest.MonkeyPatch,
    method: str, path: str, body: Any, crud_name: str, sql_table: str, ok: int,
) -> None:  # fmt: skip
    collection = "tables" if sql_table == "tables" else "pools"
    created = TABLE if collection == "tables" else POOL
    assert client.post(f"/api/v1/{collection}", json=created, headers=admin_headers).is_success
    calls = racing(monkeypatch, crud_name, sql_table)
    answer = client.request(method, path, json=body, headers=admin_headers)
    assert answer.status_code == ok, answer.text
    assert len(calls) == 2  # read again once, then written


def test_a_stale_if_match_still_answers_409_and_writes_nothing(
    client: TestClient, admin_headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert client.post("/api/v1/tables", json=TABLE, headers=admin_headers).is_success
    racing(monkeypatch, "delete_table", "tables")
    answer = client.delete("/api/v1/tables/clicks", headers={**admin_headers, "If-Match": "1"})
    assert answer.status_code == 409, answer.text
    assert client.get("/api/v1/tables/clicks", headers=admin_headers).status_code == 200
