"""A cap on how fast a reshard copies rows before its seal.

On a machine the trainers share with the nodes, the copy takes CPU and
network from their steps. Measured on 2 cores with the nodes, the resharder and
the trainer side by side (``bench/reshard_bench.py``), an uncapped copy
leaves the trainer a third to a half of its step rate while the move runs
at about half the checkpoint path's rate; held to 30 MB/s it leaves about
0.7x, the move then at 0.13-0.16x that rate. Which matters more is the fleet's owner's
call (CockroachDB's snapshot rate, TiKV's ``snap-max-write-bytes-per-sec``),
so it is a setting: the operator's ``RECSTORE_RESHARD_COPY_RATE``, ``recstore
up --reshard-copy-rate``. Only the copy before a seal is paced: the tail is a
write pause, which waiting would only lengthen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: the environment variable (and its meaning) where a provisioner reads the cap
RATE_ENV = "RECSTORE_RESHARD_COPY_RATE"


def _refused(where: str, got: object) -> ValueError:
    return ValueError(f"{where} must be a finite bytes per second >= 0 (0: no cap), got {got!r}")


def check_rate(bytes_per_s: float, where: str = RATE_ENV) -> float:
    """A copy rate in bytes per second (0: uncapped); anything else is refused."""
    if not 0 <= bytes_per_s < float("inf"):  # NaN fails both
        raise _refused(where, bytes_per_s)
    return float(bytes_per_s)


def rate_from(raw: str | None, where: str = RATE_ENV) -> float:
    """``RATE_ENV``'s value as bytes per second; unset or empty: 0 (uncapped)."""
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise _refused(where, raw) from None
    return check_rate(value, where)


def wait_s(started: float, now: float, copied: int, bytes_per_s: float) -> float:
    """How long to wait at ``now`` so that ``copied`` bytes since ``started`` stay within
    the rate (0 when uncapped or behind it)."""
    if bytes_per_s <= 0:
        return 0.0
    return max(0.0, started + copied / bytes_per_s - now)


@dataclass
class CopyPace:
    """Holds a copy to ``bytes_per_s`` (0: uncapped), counted from the pace's creation."""

    bytes_per_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    copied: int = 0
    started: float = field(init=False)

    def __post_init__(self) -> None:
        check_rate(self.bytes_per_s, "the copy rate")
        self.started = self.clock()

    def count(self, nbytes: int) -> None:
        """Count ``nbytes`` copied; returns once the copy is back within the rate."""
        self.copied += nbytes
        delay = wait_s(self.started, self.clock(), self.copied, self.bytes_per_s)
        if delay > 0:
            self.sleep(delay)
