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
from recstore.client.host_cache import from_bits, to_bits
from recstore.client.native_host_cache import NativeHostCache
from recstore.client.tensors import unique_keys

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
    resident_rows: int  # rows the cache holds
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
        self.cache = NativeHostCache(capacity_bytes, dim, dtype, policy=policy)
        self.max_staleness_steps = max_staleness_steps
        self.max_modify_size = max_modify_size
        self.step = 0
        self._versions: tuple[int, ...] | None = None  # what the cached rows were read at

    def read(self, keys: torch.Tensor) -> torch.Tensor:
        """One row per element of ``keys`` (CPU int64, any repeats), in the table dtype."""
        unique, inverse = unique_keys(keys)
        rows = self._read_unique(unique.numpy())
        if len(unique) != keys.numel():  # repeats (else first-occurrence order is keys' own)
            rows = rows[inverse.numpy().reshape(-1)]  # numpy's gather: on this thread
        return from_bits(rows, self.cache.dtype)

    def _read_unique(self, keys: np.ndarray) -> np.ndarray:
        """Rows (bits) of unique ``keys``: the cache's, then the table's for the rest."""
        staleness = self.max_staleness_steps
        since = None if staleness is None else self.step - staleness
        out = self.cache.empty_rows(len(keys))
        miss = self.cache.lookup_into(keys, out, read_since=since)
        if staleness is not None and not miss.size:  # no version to ask
            return out
        pulled, versions = self._pull(keys[miss])
        if staleness is None and versions != self._versions:
            if self._versions is not None:  # written meanwhile: no cached row is current
                self.cache.clear()
                hits = len(keys) - len(miss)
                if hits:  # nor are this batch's hits: read them again
                    self.cache.recount_hits(hits)
                    rows, self._versions = self._pull(keys)
                    self._insert(keys, rows)
                    return rows
            self._versions = versions
        out[miss] = pulled
        self._insert(keys[miss], pulled)
        return out

    def _pull(self, keys: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
        rows, versions = self.client._for_modules.pull_versioned(self.name, torch.from_numpy(keys))
        return to_bits(rows.to("cpu", self.cache.dtype)), versions

    def _insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        chunk = self.max_modify_size or max(1, len(keys))
        for start in range(0, len(keys), chunk):
            self.cache.insert(keys[start : start + chunk], rows[start : start + chunk], self.step)

    def report(self) -> CacheReport:
        stats, cache = self.cache.stats, self.cache
        return CacheReport(
            table=self.name, layer=self.layer, policy=cache.policy, hits=stats.hits,
            misses=stats.misses, evictions=stats.evictions, insertions=stats.insertions,
            rejected=stats.rejected, invalidations=stats.invalidations, hit_rate=stats.hit_rate,
            resident_rows=cache.resident_rows, bytes_used=cache.bytes_used,
            capacity_bytes=cache.capacity_bytes_used, capacity_rows=cache.capacity_rows,
        )  # fmt: skip
