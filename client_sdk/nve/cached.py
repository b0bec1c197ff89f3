"""Reading a RecStore table through a host cache, exact or with bounded staleness.

Two modes, chosen by the layer:

- exact (inference, or training without ``max_staleness_steps``): a lookup pulls
  its misses with one MultiPull per node, and every reply carries the table's
  version on that node (``freshness``: which nodes a lookup asks, and the bound
  that holds when ``version_check_interval`` lets it skip some). When any node
  reports a version other than the one the cached rows were read at, the whole
  cache is dropped and the batch is pulled again.
- bounded staleness (training with ``max_staleness_steps=k``): a row read at
  step ``s`` serves lookups up to step ``s + k``; versions are not compared,
  since a training table changes every step, and nodes whose keys all hit are
  not asked. Updates still go to the table's optimizer (the layer's backward),
  never into the cache.

A lookup's own work runs in the engine in two calls (``NativeHostCache.gather``
and ``fill``): de-dup, lookup, hit rows copied to every position, the miss
list; then the fetched rows copied to every position and offered to the cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from recstore.client.backends.base import PullRequest
from recstore.client.client import RecStoreClient
from recstore.client.host_cache import from_bits, to_bits
from recstore.client.native_host_cache import NativeHostCache
from recstore.client.nve.freshness import Freshness
from recstore.client.tensors import unique_keys
from recstore.core.cache_figures import HOST_TIER

log = logging.getLogger("recstore.nve")


@dataclass(frozen=True)
class CacheReport:
    """``layer.cache_stats()``: one tier of one table's cache as seen by one layer."""

    table: str
    layer: str
    tier: str  # recstore.core.cache_figures.TIERS: host (this class's cache) or gpu
    policy: str
    hits: int
    misses: int
    evictions: int
    insertions: int
    rejected: int
    invalidations: int
    hit_rate: float
    resident_rows: int  # rows the cache holds
    bytes_used: int  # rows held x bytes each (rows, keys, stamps, sketch share)
    capacity_bytes: int  # what the cache allocated, within host_cache_size
    capacity_rows: int

    def as_dict(self) -> dict[str, object]:
        return dict(vars(self))


@dataclass(frozen=True)
class StaleLookup:
    """A bounded-staleness lookup between its cache pass and its pull."""

    request: PullRequest  # (table, the distinct missed keys, unique)
    miss_of: np.ndarray  # per position: the index of its key among the misses, -1 for a hit
    out: np.ndarray  # the rows (the table dtype's bits), hits already in place

    @property
    def misses(self) -> torch.Tensor:
        return self.request[1]


class CachedTable:
    """Rows of ``name`` through ``client``, a ``NativeHostCache`` of ``capacity_bytes`` in front."""

    def __init__(
        self,
        client: RecStoreClient,
        name: str,
        layer: str,
        dim: int,
        dtype: torch.dtype,
        capacity_bytes: int,
        *,
        policy: str = "lfu",
        max_staleness_steps: int | None = None,
        max_modify_size: int | None = None,
        version_check_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.name, self.layer = client, name, layer
        self.cache = NativeHostCache(capacity_bytes, dim, dtype, policy=policy)
        self.max_staleness_steps = max_staleness_steps
        self.max_modify_size = max_modify_size
        self.freshness = Freshness(version_check_interval, clock)
        self.step = 0
        #: bounded staleness: per key of the last read, the oldest step its row may have
        #: been read from the table at (a GPU cache in front keeps its rows no longer)
        self.oldest_reads: np.ndarray | None = None

    def read(self, keys: torch.Tensor) -> torch.Tensor:
        """One row per element of ``keys`` (CPU int64, any repeats), in the table dtype."""
        if self.max_staleness_steps is not None:  # versions are not compared
            lookup = self.stale_lookup(keys)
            pulled = None
            if lookup.misses.numel():  # the SDK's step pull: held updates ride on it
                (pulled,) = self.client._for_modules.pull_many([lookup.request])
            return self.stale_finish(lookup, pulled)
        flat = np.ascontiguousarray(keys.reshape(-1).numpy())
        out = self.cache.empty_rows(len(flat))
        misses, miss_of = self.cache.gather(flat, out)
        fresh = self.freshness
        sent = fresh.clock()
        rows, versions = self._pull(misses, fresh.skippable(sent))
        if versions is not None and not fresh.moved(versions):
            fresh.confirm(versions, sent)
            self.cache.fill(miss_of, out, misses, rows, self.step, self._chunk)
            return from_bits(out, self.cache.dtype)
        # written meanwhile (or the slot map changed): no cached row is current, nor are
        # this lookup's hits; everything is read again, from every node
        self.cache.clear()
        self.cache.recount_hits(int(np.count_nonzero(miss_of < 0)))
        unique, inverse = unique_keys(keys.reshape(-1))
        distinct = unique.numpy()
        sent = fresh.clock()
        rows, versions = self._pull(distinct, frozenset())
        fresh.reset(versions, sent)
        if versions is None:  # not known to be current on every node: served, not kept
            return from_bits(rows[inverse.numpy()], self.cache.dtype)
        self.cache.fill(inverse.numpy(), out, distinct, rows, self.step, self._chunk)
        return from_bits(out, self.cache.dtype)

    def stale_lookup(self, keys: torch.Tensor) -> StaleLookup:
        """A bounded-staleness lookup's first half: rows read at most ``max_staleness_steps``
        ago served from the cache, the rest to pull (``StaleLookup.request``, which a
        caller may send with other tables' pulls)."""
        assert self.max_staleness_steps is not None
        flat = np.ascontiguousarray(keys.reshape(-1).numpy())
        out = self.cache.empty_rows(len(flat))
        since = self.step - self.max_staleness_steps
        misses, miss_of = self.cache.gather(flat, out, read_since=since)
        self.oldest_reads = np.where(miss_of < 0, since, self.step)
        return StaleLookup((self.name, torch.from_numpy(misses), True), miss_of, out)

    def stale_finish(self, lookup: StaleLookup, pulled: torch.Tensor | None) -> torch.Tensor:
        """The second half: the pulled rows (None when nothing missed) placed and cached."""
        if pulled is not None:
            rows = to_bits(pulled.to("cpu", self.cache.dtype))
            self.cache.fill(
                lookup.miss_of, lookup.out, lookup.misses.numpy(), rows, self.step, self._chunk
            )
        return from_bits(lookup.out, self.cache.dtype)

    @property
    def _chunk(self) -> int:
        return self.max_modify_size or 0

    def _pull(
        self, keys: np.ndarray, skip: frozenset[str]
    ) -> tuple[np.ndarray, dict[str, int] | None]:
        rows, versions = self.client._for_modules.pull_versioned(
            self.name, torch.from_numpy(keys), skip=skip
        )
        return to_bits(rows.to("cpu", self.cache.dtype)), versions

    def report(self) -> CacheReport:
        return cache_report(self.name, self.layer, HOST_TIER, self.cache)


def cache_report(table: str, layer: str, tier: str, cache: Any) -> CacheReport:
    """The figures of one cache tier (``HostCache``, ``NativeHostCache`` or the GPU tier:
    the same counters and sizes under the same names) as a ``CacheReport``."""
    stats = cache.stats
    return CacheReport(
        table=table, layer=layer, tier=tier, policy=cache.policy, hits=stats.hits,
        misses=stats.misses, evictions=stats.evictions, insertions=stats.insertions,
        rejected=stats.rejected, invalidations=stats.invalidations, hit_rate=stats.hit_rate,
        resident_rows=cache.resident_rows, bytes_used=cache.bytes_used,
        capacity_bytes=cache.capacity_bytes_used, capacity_rows=cache.capacity_rows,
    )  # fmt: skip
