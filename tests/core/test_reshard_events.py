"""The recorded moments of an online move: names, wording, and when the shared driver
records them (a move that fails records started then aborted, with the reason)."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from recstore.core.reconcile import Resharding
from recstore.core.reshard.drive import Shards, reshard
from recstore.core.reshard.events import MAX_REASON_CHARS, ReshardEvent, ReshardMoment
from recstore.core.reshard.plan import ReshardJob
from recstore.core.routing import SlotMap

JOB = ReshardJob.start("t", SlotMap.initial(2), 3)


def test_each_moment_has_an_audit_action_an_event_reason_and_words() -> None:
    started = ReshardEvent.of(ReshardMoment.started, JOB, 1)
    assert (started.action, started.reason_code, started.warning) == (
        "reshard.started", "ReshardStarted", False,
    )  # fmt: skip
    assert started.message() == (
        f"resharding 2 -> 3 shards started: {JOB.slots_total} slots to move in "
        f"{len(JOB.batches)} batches from slot-map epoch 1"
    )
    committed = ReshardEvent.of(ReshardMoment.batch_committed, JOB, 2)
    batch = JOB.batches[0]
    assert (committed.batch, committed.source, committed.target) == (0, batch.source, batch.target)
    assert committed.slots_moved == batch.slots  # the committed batch counts
    assert f"batch 1/{len(JOB.batches)} committed ({batch.slots} slots" in committed.message()
    aborted = ReshardEvent.of(ReshardMoment.aborted, JOB, 2, reason="x" * 5000, retry_in_s=2.5)
    assert aborted.warning and aborted.reason_code == "ReshardAborted"
    assert aborted.reason == "x" * MAX_REASON_CHARS
    assert aborted.message().endswith("; retrying in 2.5 s")
    resumed = ReshardEvent.of(ReshardMoment.resumed, JOB, 3, attempt=2)
    assert "resumed from its stored job" in resumed.message() and "(attempt 2)" in resumed.message()
    queued = ReshardEvent.of(ReshardMoment.queued, JOB, 1, queued_shards=4)
    assert queued.action == "reshard.queued" and "spec.shards is 4" in queued.message()
    payload = committed.payload()
    assert payload["message"] == committed.message() and "reason" not in payload
    assert ReshardEvent.model_validate(committed.to_json()) == committed


def test_an_event_out_of_range_is_refused() -> None:
    body = ReshardEvent.of(ReshardMoment.started, JOB, 1).to_json()
    wrong_fields = (
        {"to_shards": 0}, {"epoch": 0}, {"slots_total": 20000}, {"attempt": 0},
        {"retry_in_s": float("inf")},  # the audit log's JSON (PostgreSQL) holds no Infinity
    )  # fmt: skip
    for wrong in wrong_fields:
        with pytest.raises(ValidationError):
            ReshardEvent.model_validate({**body, **wrong})


def test_a_failed_attempt_says_its_number_and_when_the_next_starts() -> None:
    stopped = Resharding(2, 3, 1024, 5461, 10, 2, running=False, error="boom")
    assert stopped.describe().endswith("1024/5461 slots moved, 10 bytes: boom")
    again = Resharding(2, 3, 1024, 5461, 10, 2, running=False, error="boom", attempt=2,
                       retry_in_s=4.0)  # fmt: skip
    assert again.describe().endswith("(attempt 2): boom; retrying in 4 s")
    last = Resharding(2, 3, 1024, 5461, 10, 2, running=False, error="boom", attempt=5)
    assert "no more retries" in last.describe()


@dataclass
class MemoryStore:
    """A JobRecord in memory."""

    stored: SlotMap
    saved: ReshardJob | None = None

    def slot_map(self) -> SlotMap:
        return self.stored

    def job(self) -> ReshardJob | None:
        return self.saved

    def save_job(self, job: ReshardJob | None) -> None:
        self.saved = job

    def commit(self, expected_epoch: int, slot_map: SlotMap) -> bool:
        if self.stored.epoch != expected_epoch:
            return False
        self.stored = slot_map
        return True


@dataclass
class Recorded:
    events: list[ReshardEvent] = field(default_factory=list)
    shown: list[Resharding] = field(default_factory=list)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens there once closed


def test_a_move_whose_nodes_cannot_be_reached_records_started_then_aborted() -> None:
    recorded = Recorded()
    endpoints = [f"127.0.0.1:{_closed_port()}" for _ in range(3)]

    def failing_record(event: ReshardEvent) -> None:
        recorded.events.append(event)
        raise RuntimeError("the audit log is down")  # must not stop the move

    shards = Shards(
        name="t", endpoints=lambda: endpoints, grow_to=lambda count: None,
        serving=lambda shard, slot_map: True, shrink_to=lambda count: None,
        report=lambda: None, show=recorded.shown.append, tls=None,
        closed=threading.Event(), record=failing_record,
    )  # fmt: skip
    job = reshard(shards, MemoryStore(SlotMap.initial(2)), 3)
    assert job is not None and job.phase.value == "copying" and job.current == 0
    moments = [e.moment for e in recorded.events]
    assert moments == [ReshardMoment.started, ReshardMoment.aborted]
    aborted = recorded.events[1]
    assert aborted.epoch == 1 and aborted.slots_moved == 0 and aborted.reason
    assert "UNAVAILABLE" in aborted.reason and recorded.shown[-1].error == aborted.reason


def test_shards_built_without_a_recorder_still_move() -> None:
    """Provisioners written before the recorder existed keep working (the default)."""
    shards = Shards(
        name="t", endpoints=lambda: [], grow_to=lambda count: None,
        serving=lambda shard, slot_map: True, shrink_to=lambda count: None,
        report=lambda: None, show=lambda progress: None, tls=None, closed=threading.Event(),
    )  # fmt: skip
    shards.note(ReshardMoment.started, JOB, 1)  # no recorder: nothing happens


def test_a_queued_change_is_a_condition_until_it_starts() -> None:
    import datetime as dt

    from recstore.core.reconcile import Observation, ShardState
    from recstore.core.reconcile import compute_status as compute
    from recstore.core.status import TableStatus

    def compute_status(**kwargs):  # the wire form, as the status is stored
        return compute(**kwargs).to_wire()

    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    shards = tuple(ShardState(i, f"h:{5000 + i}", True) for i in range(3))
    moving = Resharding(2, 3, 0, 5461, 0, 1)
    kwargs = {"problem": None, "declared_shards": 4, "generation": 2, "now": now}
    queued = compute_status(
        observation=Observation(3, shards=shards, resharding=moving, queued_shards=4),
        previous=None, **kwargs,
    )  # fmt: skip
    condition = {c["type"]: c for c in queued["conditions"]}["ReshardQueued"]
    assert (condition["status"], condition["reason"]) == ("True", "ShardCountQueued")
    assert condition["message"] == (
        "spec.shards is 4 while the move to 3 shards runs; it starts when that move ends"
    )
    started = compute_status(
        observation=Observation(3, shards=shards, resharding=Resharding(3, 4, 0, 1, 0, 7)),
        previous=TableStatus.model_validate(queued), **kwargs,
    )  # fmt: skip
    emptied = {c["type"]: c for c in started["conditions"]}["ReshardQueued"]
    assert (emptied["status"], emptied["reason"]) == ("False", "NothingQueued")
    never = compute_status(observation=Observation(2, shards=shards[:2]), previous=None, **kwargs)
    assert "ReshardQueued" not in {c["type"] for c in never["conditions"]}
