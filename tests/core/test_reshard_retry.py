"""The one retry policy of a failed online move (both provisioners), as tables."""

from __future__ import annotations

import socket
import threading

import pytest

from recstore.core.reconcile import Resharding
from recstore.core.reshard.drive import Shards, reshard
from recstore.core.reshard.events import ReshardEvent, ReshardMoment
from recstore.core.reshard.retry import (
    NO_MORE_RETRIES,
    RetryPolicy,
    Tries,
    attempt_note,
    failures_after,
    retry_note,
)
from recstore.core.routing import SlotMap

from .test_reshard_events import MemoryStore

LOCAL = RetryPolicy(first_s=1.0, cap_s=60.0)  # the local platform's parameters
OPERATOR = RetryPolicy(first_s=5.0, cap_s=300.0, attempts=5)  # the operator's defaults


@pytest.mark.parametrize(
    ("policy", "waits"),
    [
        (LOCAL, [1, 2, 4, 8, 16, 32, 60, 60, 60]),  # never gives up
        (OPERATOR, [5, 10, 20, 40, None]),  # the fifth failure in a row is the last
        (RetryPolicy(5, 30, attempts=6), [5, 10, 20, 30, 30, None]),
        (RetryPolicy(0.05, 0.1, attempts=3), [0.05, 0.1, None]),
        (RetryPolicy(2, 2, attempts=1), [None]),  # a single try
    ],
)
def test_the_wait_doubles_to_its_cap_until_the_attempts_are_used(
    policy: RetryPolicy, waits: list[float | None]
) -> None:
    assert [policy.delay(n) for n in range(1, len(waits) + 1)] == waits


def test_a_very_long_row_of_failures_stays_at_the_cap() -> None:
    assert LOCAL.delay(5000) == 60.0


@pytest.mark.parametrize(
    ("first", "cap", "attempts", "says"),
    [
        (0, 1, None, "0 < first delay <= cap"),
        (-1, 1, None, "0 < first delay <= cap"),
        (10, 5, None, "0 < first delay <= cap"),
        (1, 5, 0, "at least one attempt"),
    ],
)
def test_a_policy_that_cannot_work_is_refused(
    first: float, cap: float, attempts: int | None, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        RetryPolicy(first, cap, attempts=attempts)


def test_a_delay_follows_a_failure() -> None:
    with pytest.raises(ValueError, match="at least one failure"):
        LOCAL.delay(0)


@pytest.mark.parametrize(
    ("failures", "progressed", "after"),
    [(0, False, 1), (0, True, 1), (1, False, 2), (4, False, 5), (4, True, 1), (1, True, 1)],
)
def test_a_try_that_moved_slots_starts_the_row_again(
    failures: int, progressed: bool, after: int
) -> None:
    assert failures_after(failures, progressed=progressed) == after


@pytest.mark.parametrize(
    ("moved_at_each_failure", "attempts", "waits"),
    [
        ([0, 0, 0], None, [1, 2, 4]),  # stuck at the first batch
        ([0, 0, 600, 600, 600], None, [1, 2, 1, 2, 4]),  # a batch committed in the 3rd try
        ([600, 1200, 1800, 2400], None, [1, 1, 1, 1]),  # each try moved a batch
        ([0, 0, 0], 3, [1, 2, None]),  # three failures in a row end it
        ([0, 0, 600, 600, 600], 3, [1, 2, 1, 2, None]),  # progress gave it a new row
    ],
)
def test_tries_follow_the_policy_and_the_reset_rule(
    moved_at_each_failure: list[int], attempts: int | None, waits: list[float | None]
) -> None:
    tries = Tries(RetryPolicy(1.0, 60.0, attempts=attempts))
    seen = []
    for moved in moved_at_each_failure:
        seen.append(tries.failed(moved))
        assert tries.retry_in_s == seen[-1]
        if seen[-1] is not None:
            tries.again()
            assert tries.retry_in_s is None  # a try that runs plans no retry
    assert seen == waits
    # the attempt number counts every try of the change, whatever the reset did
    assert tries.attempt == len([w for w in waits if w is not None]) + 1


@pytest.mark.parametrize(
    ("attempt", "retry_in_s", "note"),
    [
        (1, 5.0, "; retrying in 5 s"),
        (3, 0.05, "; retrying in 0.05 s"),
        (1, None, ""),  # a single try allowed: its stop is no given-up retry
        (5, None, f"; {NO_MORE_RETRIES}"),
    ],
)
def test_what_the_status_says_after_a_stopped_try(
    attempt: int, retry_in_s: float | None, note: str
) -> None:
    assert retry_note(attempt, retry_in_s) == note


@pytest.mark.parametrize(("attempt", "note"), [(1, ""), (2, " (attempt 2)"), (17, " (attempt 17)")])
def test_the_attempt_is_shown_from_the_second_on(attempt: int, note: str) -> None:
    assert attempt_note(attempt) == note


def _unreachable_shards(
    shown: list[Resharding], events: list[ReshardEvent], closed: threading.Event
):
    """Shards of three nodes nothing listens on: every try fails at its first call."""
    endpoints = []
    for _ in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            endpoints.append(f"127.0.0.1:{sock.getsockname()[1]}")
    return Shards(
        name="t", endpoints=lambda: endpoints, grow_to=lambda count: None,
        serving=lambda shard, slot_map: True, shrink_to=lambda count: None,
        report=lambda: None, show=shown.append, tls=None, closed=closed,
        record=events.append,
    )  # fmt: skip


def test_the_driver_shows_each_try_and_its_wait_in_the_status_and_events() -> None:
    """Whichever provisioner drives: a failed try's status and aborted event say its
    attempt and the policy's wait; the last allowed one says no retry follows."""
    shown: list[Resharding] = []
    events: list[ReshardEvent] = []
    shards = _unreachable_shards(shown, events, threading.Event())
    store = MemoryStore(SlotMap.initial(2))
    tries = Tries(RetryPolicy(0.5, 1.0, attempts=3))
    for attempt, wait in ((1, 0.5), (2, 1.0), (3, None)):
        assert reshard(shards, store, 3, tries=tries) is not None
        failed = shown[-1]
        assert (failed.attempt, failed.retry_in_s, failed.running) == (attempt, wait, False)
        aborted = events[-1]
        assert aborted.moment == ReshardMoment.aborted
        assert (aborted.attempt, aborted.retry_in_s) == (attempt, wait)
        assert retry_note(attempt, wait) in failed.describe()
        assert aborted.message().endswith(retry_note(attempt, wait))
        if wait is not None:
            tries.again()
    assert failed.describe().endswith(NO_MORE_RETRIES)
    begun = [e.attempt for e in events if e.moment != ReshardMoment.aborted]
    assert begun == [1, 2, 3]  # each try's first moment says its attempt too


def test_a_try_stopped_by_its_provisioner_plans_no_retry() -> None:
    shown: list[Resharding] = []
    events: list[ReshardEvent] = []
    closed = threading.Event()
    closed.set()  # stopping: the next start resumes the stored job instead
    shards = _unreachable_shards(shown, events, closed)
    tries = Tries(LOCAL)
    reshard(shards, MemoryStore(SlotMap.initial(2)), 3, tries=tries)
    assert tries.retry_in_s is None and shown[-1].retry_in_s is None
