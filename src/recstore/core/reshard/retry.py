"""When a failed online move is tried again, and what the status says about it.

Both provisioners retry a move that stopped (a node killed mid-batch, the API
server gone): the local one in its resharder thread, the operator on kopf's loop.
The policy is the same fact for both, so it lives here once; each platform
only picks the parameters (the operator from its environment). The rule:

- the wait after the n-th failed try in a row is ``first_s * 2**(n-1)``,
  capped at ``cap_s``;
- after ``attempts`` failed tries in a row no retry follows (None: always one);
- a try that moved slots before it failed (committed a batch) was not stuck:
  the count starts again, so it is the first failure of a new row.

``attempt`` (the try's number, shown as "(attempt n)") counts every try of
one change; the reset touches only the count the wait and the limit follow.
This module imports nothing of the move itself: the status
(``recstore.core.reconcile``) and the events (``recstore.core.reshard.events``)
word their messages with it, and ``recstore.core.reshard.drive`` imports both.
"""

from __future__ import annotations

from dataclasses import dataclass

#: what a stopped move's status says once its tries are used up
NO_MORE_RETRIES = "no more retries: a new spec.shards or a restart tries again"


@dataclass(frozen=True)
class RetryPolicy:
    """The waits between a failed move's tries, and how many failures in a row end them."""

    first_s: float
    cap_s: float
    attempts: int | None = None  # failed tries in a row before giving up; None: never

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.cap_s:
            raise ValueError(
                f"a retry needs 0 < first delay <= cap, got {self.first_s:g} and {self.cap_s:g} s"
            )
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"a move needs at least one attempt, got {self.attempts}")

    def delay(self, failures: int) -> float | None:
        """Seconds before the next try after ``failures`` failed tries in a row (>= 1);
        None when that was the last one allowed."""
        if failures < 1:
            raise ValueError(f"a delay follows at least one failure, got {failures}")
        if self.attempts is not None and failures >= self.attempts:
            return None
        # the exponent is bounded so a long row of failures cannot overflow the float
        return float(min(self.cap_s, self.first_s * 2 ** min(failures - 1, 64)))


#: a move tried once: no retry follows a failure (``reshard_drive.reshard`` without ``Tries``)
ONE_TRY = RetryPolicy(first_s=1.0, cap_s=1.0, attempts=1)


def failures_after(failures: int, *, progressed: bool) -> int:
    """The failed tries in a row once one more failed: a try that moved slots starts anew."""
    return 1 if progressed else failures + 1


def attempt_note(attempt: int) -> str:
    """The try's number as messages show it (nothing for the first)."""
    return "" if attempt == 1 else f" (attempt {attempt})"


def retry_note(attempt: int, retry_in_s: float | None) -> str:
    """What follows a stopped try: its retry, or that none follows (nothing when the policy
    allows a single try, so a stop is not reported as a given-up retry)."""
    if retry_in_s is not None:
        return f"; retrying in {retry_in_s:g} s"
    return f"; {NO_MORE_RETRIES}" if attempt > 1 else ""


@dataclass
class Tries:
    """The tries of one change of a table's shard count under ``policy``.

    ``failed`` is told the slots the move had moved when a try stopped; it applies
    the reset rule and keeps the wait before the next try (``retry_in_s``);
    ``again`` starts that try.
    """

    policy: RetryPolicy
    attempt: int = 1
    failures: int = 0
    retry_in_s: float | None = None
    #: slots moved when the last try failed (-1: none failed yet)
    moved_at_failure: int = -1

    def failed(self, slots_moved: int) -> float | None:
        progressed = slots_moved > self.moved_at_failure
        self.failures = failures_after(self.failures, progressed=progressed)
        self.moved_at_failure = slots_moved
        self.retry_in_s = self.policy.delay(self.failures)
        return self.retry_in_s

    def again(self) -> None:
        self.attempt += 1
        self.retry_in_s = None
