"""The local platform's online moves in the admin audit log: each moment its own event.

A PATCH of ``shards`` moves the table; the audit log then holds ``reshard.started`` (from
and to shards, slots to move, epoch), one ``reshard.batch_committed`` per batch (its slots,
the epoch after its commit), and ``reshard.finished``; a platform stopped mid-move records
``reshard.aborted`` with the reason, and the next start ``reshard.resumed``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from recstore.core.reshard.plan import ReshardJob
from recstore.core.routing import SlotMap

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPEC = {"name": "live", "numEmbeddings": 3000, "embeddingDim": 4, "shards": 2,
        "initializer": {"kind": "zeros"}}  # fmt: skip


def _moves(api: Any) -> list[dict[str, Any]]:
    """The table's reshard.* audit events, oldest first."""
    reply = api.http.get("/events", params={"table": "live", "limit": 500})
    reply.raise_for_status()
    items = [e for e in reply.json()["items"] if e["action"].startswith("reshard.")]
    return items[::-1]


def _actions(events: list[dict[str, Any]]) -> list[str]:
    return [e["action"].removeprefix("reshard.") for e in events]


def test_a_move_records_started_each_batch_and_finished(
    tmp_path: Path, helpers: SimpleNamespace
) -> None:
    platform = helpers.start_platform(tmp_path / "state")
    try:
        api = helpers.Api(platform)
        api.create_table(SPEC)
        api.wait_ready("live")
        api.http.patch("/tables/live", json={"shards": 3}).raise_for_status()
        events = helpers.wait_for(
            lambda: (moves := _moves(api)) and moves[-1]["action"] == "reshard.finished" and moves,
            180, "reshard.finished",
        )  # fmt: skip
        plan = ReshardJob.start("live", SlotMap.initial(2), 3)
        assert _actions(events) == ["started", *["batch_committed"] * len(plan.batches), "finished"]
        started, *committed, finished = (e["after"] for e in events)
        assert (started["from_shards"], started["to_shards"], started["epoch"]) == (2, 3, 1)
        assert started["slots_total"] == plan.slots_total == 5461
        assert [c["epoch"] for c in committed] == list(range(2, 2 + len(plan.batches)))
        assert [c["batch_slots"] for c in committed] == [b.slots for b in plan.batches]
        assert committed[-1]["slots_moved"] == plan.slots_total
        assert finished["slots_moved"] == plan.slots_total
        assert finished["epoch"] == 1 + len(plan.batches)
        assert "2 -> 3 shards finished" in finished["message"]
        assert {e["actor"] for e in events} == {events[0]["actor"]}
        api.http.close()
    finally:
        platform.stop()


def test_a_move_stopped_midway_records_aborted_then_resumed(
    tmp_path: Path, helpers: SimpleNamespace
) -> None:
    state = tmp_path / "state"
    first = helpers.start_platform(state, reshard_batch_slots=64)
    try:
        api = helpers.Api(first)
        api.create_table(SPEC)
        api.wait_ready("live")
        api.http.patch("/tables/live", json={"shards": 3}).raise_for_status()
        helpers.wait_for(lambda: "batch_committed" in _actions(_moves(api)), 120, "a batch")
        api.http.close()
    finally:
        first.stop()  # mid-move (86 batches of 64 slots)
    second = helpers.start_platform(state)
    try:
        api = helpers.Api(second)
        events = helpers.wait_for(
            lambda: (moves := _moves(api)) and moves[-1]["action"] == "reshard.finished" and moves,
            180, "reshard.finished after the restart",
        )  # fmt: skip
        actions = _actions(events)
        stop = actions.index("aborted")
        assert actions[0] == "started" and set(actions[1:stop]) == {"batch_committed"}
        assert events[stop]["after"]["reason"] == "the provisioner is stopping"
        assert actions[stop + 1] == "resumed"  # from where the stored job stood
        assert events[stop + 1]["after"]["slots_moved"] == events[stop]["after"]["slots_moved"]
        assert set(actions[stop + 2 : -1]) == {"batch_committed"}
        epochs = [e["after"]["epoch"] for e in events if e["action"] == "reshard.batch_committed"]
        assert epochs == sorted(epochs) and epochs[-1] == events[-1]["after"]["epoch"]
        api.http.close()
    finally:
        second.stop()
