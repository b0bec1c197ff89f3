"""When an exact host cache's rows are current: the table's versions, checked on replies.

A node moves its table's version after every write it applies, before the
write is acknowledged, and every pull reply carries the version read before
its rows. An exact cache (inference tables) drops every row as soon as any
node of the table reports a version other than the one its rows were read at.

What a lookup must ask: with ``interval`` 0 (the default) every node of the
table on every lookup (an empty item where it owns none of the missed keys),
so a lookup never returns a row older than a write acknowledged before it
began. With ``interval`` T > 0 seconds, a node whose version was confirmed by
a request sent less than T before the lookup began is asked only for its
missed keys (no round trip when they all hit). Bound: every lookup that
begins more than T seconds after a write was acknowledged reflects it (the
write moved the version before its acknowledgement, so the first reply from
a request sent after it reports the new version and the cache is dropped;
such a request is sent at the latest by the first lookup T after the last
confirmation). Writes acknowledged less than T before a lookup may not be
seen by it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from math import inf


def check_interval(value: object, what: str = "version_check_interval") -> float:
    """``value`` as seconds; ValueError (naming ``what``) unless a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < inf:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


class Freshness:
    """The versions an exact cache's rows were read at, per node, and when each was confirmed."""

    def __init__(self, interval: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval, self.clock = check_interval(interval), clock
        self._versions: dict[str, int] = {}  # node -> version the cached rows were read at
        self._confirmed: dict[str, float] = {}  # node -> when the confirming request was sent

    def skippable(self, now: float) -> frozenset[str]:
        """Nodes a lookup starting at ``now`` need not ask unless it misses their keys."""
        if self.interval <= 0:
            return frozenset()
        return frozenset(n for n, at in self._confirmed.items() if now - at < self.interval)

    def moved(self, versions: Mapping[str, int]) -> bool:
        """Does any reply report a version other than the cached rows'? (A node never seen
        before, e.g. after a slot move, counts as moved once rows are cached.)"""
        if not self._versions:
            return False
        return any(self._versions.get(node) != v for node, v in versions.items())

    def confirm(self, versions: Mapping[str, int], sent: float) -> None:
        """The rows are current as of ``versions``, asked for by a request sent at ``sent``."""
        self._versions.update(versions)
        for node in versions:
            self._confirmed[node] = sent

    def reset(self, versions: Mapping[str, int] | None, sent: float) -> None:
        """The cache was emptied: only ``versions`` (None: nothing) describe its rows now."""
        self._versions.clear()
        self._confirmed.clear()
        if versions is not None:
            self.confirm(versions, sent)
