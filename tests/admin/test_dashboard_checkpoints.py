"""The dashboard shows how each requested checkpoint went, from the reported status: a
completed one's shards and rows, a failed one's reason, and the table's last checkpoint."""

from __future__ import annotations

from html import escape

from fastapi.testclient import TestClient

from .conftest import dashboard_login

SPEC = {"name": "clicks", "numEmbeddings": 1000, "embeddingDim": 16, "shards": 2}


def _report(client: TestClient, headers: dict[str, str], **checkpoints: object) -> None:
    r = client.put(
        "/api/v1/tables/clicks/status", json={"phase": "Ready", **checkpoints}, headers=headers
    )
    assert r.status_code == 200, r.text


def test_table_page_shows_each_checkpoints_outcome(
    client: TestClient, admin_headers: dict[str, str], provisioner_headers: dict[str, str]
) -> None:
    assert client.post("/api/v1/tables", json=SPEC, headers=admin_headers).status_code == 201
    checkpoints = "/api/v1/tables/clicks/checkpoints"
    first = client.post(checkpoints, headers=admin_headers).json()["id"]
    shards = [
        {"index": 0, "endpoint": "127.0.0.1:5001", "rows": 40},
        {"index": 1, "endpoint": "127.0.0.1:6001", "rows": 60},
    ]
    done = {"id": f"request-{first}", "requestId": first, "state": "Completed",
            "at": "2026-01-01T00:00:00Z", "shards": shards}  # fmt: skip
    _report(client, provisioner_headers, lastCheckpoint=done, checkpointRequest=done)
    second = client.post(checkpoints, headers=admin_headers).json()["id"]
    reason = "shard 1 (127.0.0.1:6001): UNAVAILABLE: <disk> busy"
    broken = [shards[0], {"index": 1, "error": "UNAVAILABLE"}]
    failed = {"id": f"request-{second}", "requestId": second, "state": "Failed",
              "message": reason, "shards": broken}  # fmt: skip
    _report(client, provisioner_headers, lastCheckpoint=done, checkpointRequest=failed)

    dashboard_login(client, admin_headers["Authorization"].removeprefix("Bearer "))
    page = client.get("/ui/tables/clicks").text
    assert f"Last checkpoint request-{first} at 2026-01-01T00:00:00Z, 2 shard(s)." in page
    assert '<td class="outcome">2 shard(s), 100 rows</td>' in page
    assert f'<td class="outcome"><span class="warn">{escape(reason)}</span></td>' in page
    listing = client.get("/ui/checkpoints").text
    assert escape(reason) in listing
