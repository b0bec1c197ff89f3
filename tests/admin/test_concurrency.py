"""Optimistic concurrency: racing patches on one table, exactly one wins, the rest get 409."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from recstore.admin import crud
from recstore.admin.errors import VersionConflict

WRITERS = 6


def test_concurrent_patches_with_the_same_version(
    client: TestClient, admin_headers: dict[str, str]
) -> None:
    spec = {"name": "race", "numEmbeddings": 10, "embeddingDim": 4}
    assert client.post("/api/v1/tables", json=spec, headers=admin_headers).status_code == 201
    start = threading.Barrier(WRITERS)

    def patch(i: int) -> int:
        start.wait(timeout=30)
        r = client.patch(
            "/api/v1/tables/race",
            json={"optimizer": {"lr": 0.1 * (i + 1)}},
            headers={**admin_headers, "If-Match": '"1"'},
        )
        return r.status_code

    with ThreadPoolExecutor(WRITERS) as pool:
        statuses = list(pool.map(patch, range(WRITERS)))
    assert sorted(statuses) == [200] + [409] * (WRITERS - 1)
    final = client.get("/api/v1/tables/race", headers=admin_headers).json()
    assert final["resource_version"] == 2
    updates = client.get("/api/v1/events?action=table.update", headers=admin_headers).json()
    assert updates["total"] == 1  # losers left no audit record either


def test_lost_race_is_detected_by_the_database(
    app: FastAPI, client: TestClient, admin_headers: dict[str, str]
) -> None:
    """Two sessions read version 1; the slower writer fails at flush, not silently."""
    spec = {"name": "race2", "numEmbeddings": 10, "embeddingDim": 4}
    assert client.post("/api/v1/tables", json=spec, headers=admin_headers).status_code == 201
    sessions = app.state.context.sessions
    with sessions() as first, sessions() as second:
        a = crud.get_table(first, name="race2")
        b = crud.get_table(second, name="race2")
        assert a.resource_version == b.resource_version == 1
        crud.patch_table(first, table=a, changes={"shards": 2}, expected_version=1, actor="a")
        crud.commit(first)
        with pytest.raises(VersionConflict):
            crud.patch_table(second, table=b, changes={"shards": 3}, expected_version=1, actor="b")
            crud.commit(second)
    got = client.get("/api/v1/tables/race2", headers=admin_headers).json()
    assert got["spec"]["shards"] == 2 and got["resource_version"] == 2
