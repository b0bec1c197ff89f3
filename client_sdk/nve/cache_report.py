"""Sending a layer's cache counters to its table's nodes, so their table view shows them.

A layer's caches live in the trainer's process (the host tier and, on a GPU,
the GPU tier in front of it), where no node can see their hits. The layer
therefore reports each tier's running totals (``CacheReport``, one entry per
tier, named by ``recstore.core.cache_figures.TIERS``) to every node of the
table: on its first lookup, then at most once every ``cache_report_interval``
seconds (a lookup that finds a report due sends it; 0: never on its own), and
whenever ``layer.report_cache_stats()`` is called. The cost is one small RPC
per node per interval, whatever the lookup rate or the number of tiers.
Running totals make a lost report harmless (the next one carries everything),
so a report sent from the lookup path that fails is logged and never fails
the lookup.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from recstore.client.nve.cached import CachedTable, CacheReport
from recstore.client.nve.device_cache_tiers import DeviceCachedTable
from recstore.core.cache_figures import CacheFigures, ClientCache

log = logging.getLogger("recstore.nve")


def client_name(role: str) -> str:
    """Who is reporting, as the table view names it: ``host:pid:role``."""
    return f"{socket.gethostname()}:{os.getpid()}:{role}"


def client_cache_of(report: CacheReport, role: str) -> ClientCache:
    """One tier's figures (``cache_report``, the same for every tier) as the nodes keep them."""
    figures = CacheFigures(
        hits=report.hits, misses=report.misses, evictions=report.evictions,
        resident_rows=report.resident_rows, resident_bytes=report.bytes_used,
        capacity_bytes=report.capacity_bytes,
    )  # fmt: skip
    return ClientCache(client_name(role), report.layer, report.policy, figures, tier=report.tier)


class CacheReporter:
    """Reports one layer's cache tiers now (``send``) or when a report is due
    (``maybe_send``): ``cached``, the host tier, and ``gpu``, the GPU tier, if any."""

    def __init__(
        self,
        cached: CachedTable,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        gpu: DeviceCachedTable | None = None,
    ) -> None:
        self._cached, self._interval, self._clock = cached, interval_s, clock
        self._tiers: list[CachedTable | DeviceCachedTable] = [cached]
        if gpu is not None:  # lookup order: the GPU tier in front of the host tier
            self._tiers.insert(0, gpu)
        # the first lookup reports, so the cache shows at once; 0: only when asked
        self._due: float | None = clock() if interval_s else None

    def reports(self) -> list[CacheReport]:
        """Each tier's figures, in lookup order (the GPU tier, then the host tier)."""
        return [tier.report() for tier in self._tiers]

    def send(self) -> None:
        """Report now; a failure is raised (the caller asked for this report)."""
        cached = self._cached
        role = cached.client.role
        caches = [client_cache_of(report, role) for report in self.reports()]
        cached.client._for_modules.report_caches(cached.name, caches)

    def maybe_send(self) -> None:
        """Report when due; on the lookup path, so a failure is logged, not raised."""
        if self._due is None or self._clock() < self._due:
            return
        self._due = self._clock() + self._interval
        try:
            self.send()
        except Exception as error:  # the next report carries the same totals
            log.warning("cache report for table %s failed: %s", self._cached.name, error)
