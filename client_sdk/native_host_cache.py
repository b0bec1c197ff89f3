"""The host cache the SDK reads through: the policy of ``host_cache``, run by the engine.

The policy (set-associative, TinyLFU admission or LRU, byte-bounded) stated in
numpy is the tests' model (``tests/client/host_cache_model.py``), which this
class is held to slot by slot; its several array passes per batch cost about
what a loopback pull saves, so lookups go through
``recstore._native.HostRowCache``, which runs the same steps in one loop each
and copies hit rows straight into the caller's output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from recstore import _native as _native_module
from recstore.client.host_cache import (
    POLICIES,
    WAYS,
    CacheStats,
    bytes_per_row,
    to_bits,
)

_native: Any = _native_module


class NativeHostCache:
    """Rows of one table keyed by int64 id; ``capacity_bytes`` bounds everything it holds."""

    def __init__(
        self, capacity_bytes: int, dim: int, dtype: torch.dtype, *, policy: str = "lfu"
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"cache policy must be one of {POLICIES}, got {policy!r}")
        if capacity_bytes < 0:
            raise ValueError(f"host_cache_size must be >= 0 bytes, got {capacity_bytes}")
        self.policy, self.dim, self.dtype = policy, dim, dtype
        self._bits = to_bits(torch.empty((0, dim), dtype=dtype)).dtype
        row_bytes = dim * self._bits.itemsize
        self._row_cost = bytes_per_row(row_bytes)
        num_sets = capacity_bytes // (self._row_cost * WAYS)
        self._native = _native.HostRowCache(num_sets, row_bytes, policy == "lru")
        self.capacity_rows = int(self._native.capacity_rows)
        self._recounted = 0  # hits the caller took back as misses (see recount_hits)

    @property
    def enabled(self) -> bool:
        return self.capacity_rows > 0

    @property
    def capacity_bytes_used(self) -> int:
        return self.capacity_rows * self._row_cost

    @property
    def resident_rows(self) -> int:
        return int(self._native.held())

    @property
    def bytes_used(self) -> int:
        return self.resident_rows * self._row_cost

    @property
    def stats(self) -> CacheStats:
        raw = self._native.stats()
        return CacheStats(
            hits=raw["hits"] - self._recounted, misses=raw["misses"] + self._recounted,
            evictions=raw["evictions"], insertions=raw["insertions"], rejected=raw["rejected"],
            invalidations=raw["invalidations"],
        )  # fmt: skip

    def empty_rows(self, n: int) -> np.ndarray:
        """An output for ``n`` rows (the table dtype's bits)."""
        return np.empty((n, self.dim), dtype=self._bits)

    def lookup_into(
        self, keys: npt.NDArray[np.int64], out: np.ndarray, *, read_since: int | None = None
    ) -> npt.NDArray[np.int64]:
        """For unique ``keys``: hit rows copied into ``out`` (``empty_rows``), the access
        counted; returns the positions of the misses. ``read_since``: rows read at an
        earlier step are dropped and count as misses."""
        return np.asarray(self._native.lookup(keys, out.view(np.uint8), read_since))

    def gather(
        self, keys: npt.NDArray[np.int64], out: np.ndarray, *, read_since: int | None = None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """A layer's lookup in one pass: ``keys`` may repeat. Their distinct keys (first
        occurrence first) are looked up as ``lookup_into`` looks them up, each hit's row
        copied to every position of ``out`` it occurs at. Returns (the distinct missed
        keys, per position the index of its key among them or -1 for a hit)."""
        misses, miss_of = self._native.gather(keys, out.view(np.uint8), read_since)
        return np.asarray(misses), np.asarray(miss_of)

    def fill(
        self,
        miss_of: npt.NDArray[np.int64],
        out: np.ndarray,
        misses: npt.NDArray[np.int64],
        rows: np.ndarray,
        step: int = 0,
        chunk: int = 0,
    ) -> None:
        """``gather``'s second half: the missed keys' ``rows`` (bits, one per miss) copied to
        every position of ``out`` that asked for them, then offered to the cache
        (``chunk`` keys per insert; 0: all at once), read at ``step``."""
        if rows.dtype != self._bits:
            raise TypeError(f"rows must be {self._bits} (the table dtype's bits), got {rows.dtype}")
        self._native.fill(
            miss_of, out.view(np.uint8), misses, np.ascontiguousarray(rows).view(np.uint8),
            step, chunk,
        )  # fmt: skip

    def insert(self, keys: npt.NDArray[np.int64], rows: np.ndarray, step: int = 0) -> None:
        """Offer missed (unique, not cached) ``keys`` and their rows (bits), read at ``step``."""
        if rows.dtype != self._bits:
            raise TypeError(f"rows must be {self._bits} (the table dtype's bits), got {rows.dtype}")
        self._native.insert(keys, np.ascontiguousarray(rows).view(np.uint8), step)

    def recount_hits(self, n: int) -> None:
        """``n`` hits of the last lookup were not served after all (the table moved on)."""
        self._recounted += n

    def clear(self) -> None:
        """Drop every row (the table moved to a newer version); frequencies stay."""
        self._native.clear()

    def directory(self) -> tuple[np.ndarray, np.ndarray]:
        """(key, stamp) of every slot, set by set (empty: key -1), for model checks."""
        keys = np.asarray(self._native.keys()).reshape(-1, WAYS)
        return keys, np.asarray(self._native.stamps()).reshape(-1, WAYS)
