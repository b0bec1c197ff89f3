"""Reading a RecStore table through a host cache, exact or with bounded staleness.

Two modes, chosen by the layer:

- exact (inference, or training without ``max_staleness_steps``): every lookup
  pulls its misses together with the table's version on every shard (an empty
  pull where a shard owns none of them). When any shard reports a version other
  than the one the cached rows were read at, the whole cache is dropped and the
  batch is pulled again, so a lookup never returns a row older than the writes
  finished before it began.
- bounded staleness (training with ``max_staleness_steps=k``): a row read at
  step ``s`` serves lookups up to step ``s + k``; versions are not compared,
  since a training table changes every step. Updates still go to the table's
  optimizer (the layer's backward), never into the cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from recstore.client.client import RecStoreClient
from recstore.client.host_cache import HostCache
from recstore.client.tensors import keys_to_numpy

log = logging.getLogger("recstore.nve")


@dataclass(frozen=True)
class CacheReport:
    """``layer.cache_stats()``: one table's cache as seen by one layer."""

    table: str
    layer: str
    policy: str
    hits: int
    misses: int
    evictions: int
    insertions: int
    rejected: int
    invalidations: int
    hit_rate: float
    bytes_used: int  # rows held x bytes each (rows, keys, stamps, sketch share)
    capacity_bytes: int  # what the cache allocated, within host_cache_size
    capacity_rows: int

    def as_dict(self) -> dict[str, object]:
        return dict(vars(self))


class CachedTable:
    """Rows of ``name`` through ``client``, a ``HostCache`` of ``capacity_bytes`` in front."""

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
    ) -> None:
        self.client, self.name, self.layer = client, name, layer
        self.cache = HostCache(capacity_bytes, dim, dtype, policy=policy)
        self.max_staleness_steps = max_staleness_steps
        self.max_modify_size = max_modify_size
        self.step = 0
        self._versions: tuple[int, ...] | None = None  # what the cached rows were read at

    def read(self, keys: torch.Tensor) -> torch.Tensor:
        """One row per element of ``keys`` (CPU int64, any repeats), in the table dtype."""
        unique, inverse = torch.unique(keys, return_inverse=True)
        rows = self._read_unique(unique)
        return rows.index_select(0, inverse)

    def _read_unique(self, keys: torch.Tensor) -> torch.Tensor:
        keys_np = keys_to_numpy(keys)
        staleness = self.max_staleness_steps
        since = None if staleness is None else self.step - staleness
        hit, slots = self.cache.lookup(keys_np, read_since=since)
        miss = np.flatnonzero(~hit)
        out = torch.empty((len(keys_np), self.cache.dim), dtype=self.cache.dtype)
        if staleness is not None and not miss.size:  # bounded staleness: no version to ask
            return self.cache.rows(slots)
        pulled, versions = self.client._for_modules.pull_versioned(
            self.name, keys[torch.from_numpy(miss)]
        )
        if staleness is None and versions != self._versions:
            if self._versions is not None:  # written meanwhile: no cached row is current
                self.cache.clear()
                if slots.size:  # nor are this batch's hits: read them again
                    self.cache.stats.hits -= len(slots)
                    self.cache.stats.misses += len(slots)
                    return self._pull_all(keys, keys_np)
            self._versions = versions
        if slots.size:
            out[torch.from_numpy(np.flatnonzero(hit))] = self.cache.rows(slots)
        out[torch.from_numpy(miss)] = pulled
        self._insert(keys_np[miss], pulled)
        return out

    def _pull_all(self, keys: torch.Tensor, keys_np: np.ndarray) -> torch.Tensor:
        rows, self._versions = self.client._for_modules.pull_versioned(self.name, keys)
        self._insert(keys_np, rows)
        return rows

    def _insert(self, keys_np: np.ndarray, rows: torch.Tensor) -> None:
        chunk = self.max_modify_size or max(1, len(keys_np))
        for start in range(0, len(keys_np), chunk):
            self.cache.insert(
                keys_np[start : start + chunk], rows[start : start + chunk], self.step
            )

    def report(self) -> CacheReport:
        stats, cache = self.cache.stats, self.cache
        return CacheReport(
            table=self.name, layer=self.layer, policy=cache.policy, hits=stats.hits,
            misses=stats.misses, evictions=stats.evictions, insertions=stats.insertions,
            rejected=stats.rejected, invalidations=stats.invalidations, hit_rate=stats.hit_rate,
            bytes_used=cache.bytes_used, capacity_bytes=cache.capacity_bytes_used,
            capacity_rows=cache.capacity_rows,
        )  # fmt: skip
