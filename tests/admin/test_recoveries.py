"""An operator's recovery of a refused table (``recstore recover``) in the audit log, with
exactly what each node dropped (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

SPEC = {"name": "clicks", "numEmbeddings": 1000, "embeddingDim": 16, "shards": 2}


def report(table: str = "clicks") -> dict[str, Any]:
    """What ``recstore recover --accept-log-loss`` posts: shard 0 recovered, 1 refused."""
    return {
        "table": table,
        "accept_log_loss": True,
        "shards": [
            {"shard": 0, "endpoint": "127.0.0.1:7000", "outcome": "recovered", "table": table,
             "how": "restored from checkpoint 'ckpt-00000002' and ...",
             "damage": "segment 000000000001.wal, offset 5576: checksum mismatch",
             "replayed_records": 99, "writes_dropped": 201, "quarantine": "wal-quarantine/x",
             "dropped": [{"generation": 1, "offset": 5576, "bytes": 11256, "writes": 201}]},
            {"shard": 1, "endpoint": "127.0.0.1:7001", "outcome": "failed",
             "error": "FAILED_PRECONDITION: table 'clicks' is not served: ..."},
        ],
    }  # fmt: skip


def test_a_recovery_is_an_audit_event_with_what_was_dropped(
    client: TestClient, admin_headers: dict[str, str], as_role: Callable[[str], dict[str, str]]
) -> None:
    assert client.post("/api/v1/tables", json=SPEC, headers=admin_headers).status_code == 201
    posted = client.post(
        "/api/v1/tables/clicks/recoveries", json=report(), headers=as_role("editor")
    )
    assert posted.status_code == 201, posted.text
    assert posted.json()["action"] == "table.recover"
    (event,) = client.get(
        "/api/v1/events?table=clicks&action=table.recover", headers=admin_headers
    ).json()["items"]
    assert event["actor"].startswith("editor-user") and event["resource_name"] == "clicks"
    after = event["after"]
    assert after["acceptLogLoss"] is True
    recovered, refused = after["shards"]
    assert recovered["dropped"] == [
        {"generation": 1, "offset": 5576, "bytes": 11256, "writes": 201}
    ]
    assert recovered["writesDropped"] == 201 and recovered["replayedRecords"] == 99
    assert refused["outcome"] == "failed" and "is not served" in refused["error"]


def test_a_recovery_is_the_editors_to_record_and_of_the_table_named(
    client: TestClient, admin_headers: dict[str, str], as_role: Callable[[str], dict[str, str]]
) -> None:
    assert client.post("/api/v1/tables", json=SPEC, headers=admin_headers).status_code == 201
    url = "/api/v1/tables/clicks/recoveries"
    assert client.post(url, json=report(), headers=as_role("viewer")).status_code == 403
    assert client.post(url, json=report(), headers={}).status_code == 401
    other = client.post(url, json=report("views"), headers=as_role("editor"))
    assert other.status_code == 422 and "not 'clicks'" in other.text
    bad = report()
    bad["shards"][0]["outcome"] = "maybe"
    assert client.post(url, json=bad, headers=as_role("editor")).status_code == 422
    missing = client.post(
        "/api/v1/tables/nope/recoveries", json=report("nope"), headers=as_role("editor")
    )
    assert missing.status_code == 404
    events = client.get("/api/v1/events?action=table.recover", headers=admin_headers).json()
    assert events["total"] == 0  # nothing refused was recorded
