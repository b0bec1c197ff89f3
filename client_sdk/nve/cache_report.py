"""Sending a layer's host-cache counters to its table's nodes, so their table view shows them.

A host cache lives in the trainer's process, where no node can see its hits.
The layer therefore reports its cache's running totals (``CacheReport``) to
every node of the table: on its first lookup, then at most once every
``cache_report_interval`` seconds (a lookup that finds a report due sends it;
0: never on its own), and whenever ``layer.report_cache_stats()`` is called. The cost is one small
RPC per node per interval, whatever the lookup rate. Running totals make a
lost report harmless (the next one carries everything), so a report sent from
the lookup path that fails is logged and never fails the lookup.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from recstore.client.nve.cached import CachedTable
from recstore.core.cache_figures import CacheFigures, ClientCache

log = logging.getLogger("recstore.nve")


def client_name(role: str) -> str:
    """Who is reporting, as the table view names it: ``host:pid:role``."""
    return f"{socket.gethostname()}:{os.getpid()}:{role}"


def client_cache_of(cached: CachedTable) -> ClientCache:
    """The cache's figures as the nodes keep them."""
    report = cached.report()
    figures = CacheFigures(
        hits=report.hits, misses=report.misses, evictions=report.evictions,
        resident_rows=report.resident_rows, resident_bytes=report.bytes_used,
        capacity_bytes=report.capacity_bytes,
    )  # fmt: skip
    return ClientCache(client_name(cached.client.role), cached.layer, report.policy, figures)


class CacheReporter:
    """Reports one layer's cache now (``send``) or when one is due (``maybe_send``)."""

    def __init__(
        self,
        cached: CachedTable,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cached, self._interval, self._clock = cached, interval_s, clock
        # the first lookup reports, so the cache shows at once; 0: only when asked
        self._due: float | None = clock() if interval_s else None

    def send(self) -> None:
        """Report now; a failure is raised (the caller asked for this report)."""
        cached = self._cached
        cached.client._for_modules.report_caches(cached.name, [client_cache_of(cached)])

    def maybe_send(self) -> None:
        """Report when due; on the lookup path, so a failure is logged, not raised."""
        if self._due is None or self._clock() < self._due:
            return
        self._due = self._clock() + self._interval
        try:
            self.send()
        except Exception as error:  # the next report carries the same totals
            log.warning("cache report for table %s failed: %s", self._cached.name, error)
