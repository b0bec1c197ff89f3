"""The dashboard's table page shows an online move's progress from the reported status.

A provisioner (the operator's mirror or the local one) reports phase Resharding with a
``Resharding`` condition whose message carries slots moved / total, bytes and the epoch;
the table page shows it above the conditions, and the finished move's outcome after.
"""

from __future__ import annotations

from html import escape

from fastapi.testclient import TestClient

from .conftest import dashboard_login

SPEC = {"name": "clicks", "numEmbeddings": 1000, "embeddingDim": 16, "shards": 2}


def _report(
    client: TestClient, headers: dict[str, str], status: str, reason: str, msg: str
) -> None:
    condition = {"type": "Resharding", "status": status, "reason": reason, "message": msg}
    phase = "Resharding" if status == "True" else "Ready"
    r = client.put(
        "/api/v1/tables/clicks/status",
        json={"phase": phase, "conditions": [condition]},
        headers=headers,
    )
    assert r.status_code == 200, r.text


def test_table_page_shows_resharding_progress(
    client: TestClient, admin_headers: dict[str, str], provisioner_headers: dict[str, str]
) -> None:
    assert client.post("/api/v1/tables", json=SPEC, headers=admin_headers).status_code == 201
    moving = "resharding 2 -> 3 shards, slot-map epoch 3: 2048/5461 slots moved, 123456 bytes"
    _report(client, provisioner_headers, "True", "MovingSlots", moving)
    dashboard_login(client, admin_headers["Authorization"].removeprefix("Bearer "))
    page = client.get("/ui/tables/clicks").text
    assert '<p id="resharding" class="warn">MovingSlots: ' + escape(moving) in page
    done = "resharding 2 -> 3 shards, slot-map epoch 7: 5461/5461 slots moved, 654321 bytes"
    _report(client, provisioner_headers, "False", "MoveDone", done)
    page = client.get("/ui/tables/clicks").text
    assert '<p id="resharding" class="meta">MoveDone: ' + escape(done) in page
