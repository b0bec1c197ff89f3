"""The caches trainers hold in front of this node's tables, as they last reported them.

A trainer's SDK cache (``recstore.nve`` with ``host_cache_size``, and a GPU
tier in front with ``gpu_cache_size``) lives in the trainer's process, so the
node cannot count its hits; instead each process sends its caches' running
totals to every node of the table now and then (``CacheReport``, one entry
per tier), and the node keeps the latest report of each (client, layer,
tier). Running totals make a lost or repeated report harmless.
Memory is bounded: at most ``MAX_CACHES_PER_TABLE`` caches per table (the
longest silent one goes first), and a cache silent for ``STALE_AFTER_S`` is
dropped, so a finished job leaves the view on its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from recstore.core.cache_figures import TIERS, ClientCache
from recstore.core.errors import InvalidArgument

#: caches kept per table (a report of more at once is refused): 64 layers, every tier of each
MAX_CACHES_PER_TABLE = 64 * len(TIERS)
#: a cache not heard from for this long leaves the view
STALE_AFTER_S = 600.0
#: the longest client, layer and policy names a report may carry
MAX_NAME_CHARS = 200


def check_report(caches: Sequence[ClientCache]) -> None:
    """A report's caches are well-formed; ``InvalidArgument`` (nothing kept) otherwise."""
    if len(caches) > MAX_CACHES_PER_TABLE:
        raise InvalidArgument(
            f"a cache report may carry at most {MAX_CACHES_PER_TABLE} caches, got {len(caches)}"
        )
    seen = set()
    for cache in caches:
        if not cache.client:
            raise InvalidArgument("a cache report needs the reporting client's name")
        for what, value in (("client", cache.client), ("layer", cache.layer),
                            ("policy", cache.policy)):  # fmt: skip
            if len(value) > MAX_NAME_CHARS:
                raise InvalidArgument(f"cache {what} name longer than {MAX_NAME_CHARS} characters")
        if cache.tier not in TIERS:
            named = cache.tier[:MAX_NAME_CHARS]
            raise InvalidArgument(
                f"cache {cache.client!r} / {cache.layer!r} names tier {named!r}; "
                f"a cache tier is one of {', '.join(TIERS)}"
            )
        if cache.key in seen:
            raise InvalidArgument(
                f"cache {cache.client!r} / {cache.layer!r} / {cache.tier} reported twice"
            )
        seen.add(cache.key)


class CacheReports:
    """Per table, the latest report of each (client, layer, tier); thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: dict[str, dict[tuple[str, str, str], ClientCache]] = {}

    def report(self, table: str, caches: Sequence[ClientCache]) -> None:
        """Keep ``caches`` (checked first) as the newest of ``table``, stamped now."""
        check_report(caches)
        now = self._clock()
        with self._lock:
            held = self._tables.setdefault(table, {})
            for cache in caches:
                held.pop(cache.key, None)  # re-inserted last: dicts keep report order
                held[cache.key] = replace(cache, reported_unix=now)
            self._expire(held, now)
            while len(held) > MAX_CACHES_PER_TABLE:
                del held[next(iter(held))]  # the one silent longest

    def of(self, table: str) -> list[ClientCache]:
        """``table``'s caches heard from within ``STALE_AFTER_S``, by client, layer and tier."""
        with self._lock:
            held = self._tables.get(table)
            if not held:
                return []
            self._expire(held, self._clock())
            return [held[key] for key in sorted(held)]

    def forget(self, table: str) -> None:
        """A dropped table's reports go with it."""
        with self._lock:
            self._tables.pop(table, None)

    @staticmethod
    def _expire(held: dict[tuple[str, str, str], ClientCache], now: float) -> None:
        for key in [k for k, c in held.items() if now - c.reported_unix > STALE_AFTER_S]:
            del held[key]
