"""A table's online move in the audit log: the provisioner posts each moment, and the events
API and the dashboard's events page show it as ``reshard.<moment>`` (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from fastapi.testclient import TestClient

from recstore.core.reshard.events import ReshardEvent, ReshardMoment
from recstore.core.reshard.plan import ReshardJob
from recstore.core.routing import SlotMap

from .conftest import dashboard_login

SPEC = {"name": "clicks", "numEmbeddings": 1000, "embeddingDim": 16, "shards": 2}
JOB = ReshardJob.start("clicks", SlotMap.initial(2), 3)


def _events(client: TestClient, headers: dict[str, str]) -> list[dict[str, object]]:
    r = client.get("/api/v1/events?table=clicks", headers=headers)
    assert r.status_code == 200, r.text
    return [e for e in r.json()["items"] if str(e["action"]).startswith("reshard.")]


def test_each_moment_of_a_move_is_its_own_audit_event(
    client: TestClient, admin_headers: dict[str, str], provisioner_headers: dict[str, str]
) -> None:
    assert client.post("/api/v1/tables", json=SPEC, headers=admin_headers).status_code == 201
    moments = [
        ReshardEvent.of(ReshardMoment.started, JOB, 1),
        ReshardEvent.of(ReshardMoment.batch_committed, JOB, 2),
        ReshardEvent.of(ReshardMoment.aborted, JOB, 2, reason="slots differ", retry_in_s=5.0),
        ReshardEvent.of(ReshardMoment.resumed, JOB, 2, attempt=2),
        ReshardEvent.of(ReshardMoment.finished, JOB, 7, attempt=2),
    ]
    for event in moments:
        r = client.post(
            "/api/v1/tables/clicks/resharding-events",
            json=event.to_json(),
            headers=provisioner_headers,
        )
        assert r.status_code == 201, r.text
        assert r.json()["action"] == event.action and r.json()["table_name"] == "clicks"
    events = _events(client, admin_headers)[::-1]  # oldest first
    assert [e["action"] for e in events] == [
        "reshard.started", "reshard.batch_committed", "reshard.aborted", "reshard.resumed",
        "reshard.finished",
    ]  # fmt: skip
    started, committed, aborted = (e["after"] for e in events[:3])
    assert isinstance(started, dict) and isinstance(committed, dict) and isinstance(aborted, dict)
    assert (started["from_shards"], started["to_shards"], started["epoch"]) == (2, 3, 1)
    assert started["slots_total"] == JOB.slots_total and started["batches"] == len(JOB.batches)
    assert committed["epoch"] == 2 and committed["batch"] == 0
    assert committed["slots_moved"] == committed["batch_slots"] == JOB.batches[0].slots
    assert aborted["reason"] == "slots differ" and "retrying in 5 s" in str(aborted["message"])
    assert {e["actor"] for e in events} == {events[0]["actor"]}  # the provisioner identity
    only = client.get("/api/v1/events?action=reshard.aborted", headers=admin_headers).json()
    assert only["total"] == 1

    dashboard_login(client, admin_headers["Authorization"].split()[1])
    page = client.get("/ui/events?table=clicks").text
    assert "reshard.started" in page and "reshard.batch_committed" in page
    assert escape(moments[-1].message()) in page  # the moment in words, not only as JSON


def test_only_the_provisioner_records_moves_and_bad_events_change_nothing(
    client: TestClient,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    as_role: Callable[[str], dict[str, str]],
) -> None:
    assert client.post("/api/v1/tables", json=SPEC, headers=admin_headers).status_code == 201
    body = ReshardEvent.of(ReshardMoment.started, JOB, 1).to_json()
    url = "/api/v1/tables/clicks/resharding-events"
    for role in ("viewer", "editor", "admin"):
        assert client.post(url, json=body, headers=as_role(role)).status_code == 403
    bad = [
        {**body, "moment": "exploded"},
        {**body, "to_shards": 0},
        {**body, "epoch": 0},
        {**body, "unknown": 1},
        {**body, "reason": "x" * 5000},
    ]
    for wrong in bad:
        r = client.post(url, json=wrong, headers=provisioner_headers)
        assert r.status_code == 422, (wrong, r.text)
    missing = client.post(
        "/api/v1/tables/nope/resharding-events", json=body, headers=provisioner_headers
    )
    assert missing.status_code == 404
    assert _events(client, admin_headers) == []
