"""The host cache's policy in numpy: the oracle the engine's cache and the GPU tier are
held to, slot by slot.

Every operation is vectorised over a batch of unique keys. The product's caches
(``recstore.client.native_host_cache.NativeHostCache``, run by the engine, and the
NVE layers' GPU tier, ``recstore.client.nve.device_cache``) take the same steps; the
tests compare their keys, stamps and rows to this model's after every batch. The
policy itself is described in ``recstore.client.host_cache``, whose constants this
model reads.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from recstore.client.host_cache import (
    _SET_HASH,
    _SKETCH_HASHES,
    AGE_EVERY,
    POLICIES,
    SKETCH_DEPTH,
    SKETCH_MAX,
    SKETCH_WIDTH,
    WAYS,
    CacheStats,
    bytes_per_row,
    to_bits,
)

EMPTY = np.int64(-1)  # the key of an empty slot (table keys are >= 0)


class HostCache:
    """Rows of one table keyed by int64 id; ``capacity_bytes`` bounds everything it holds."""

    def __init__(
        self, capacity_bytes: int, dim: int, dtype: torch.dtype, *, policy: str = "lfu"
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"cache policy must be one of {POLICIES}, got {policy!r}")
        if capacity_bytes < 0:
            raise ValueError(f"host_cache_size must be >= 0 bytes, got {capacity_bytes}")
        self.policy = policy
        self.dim, self.dtype = dim, dtype
        row_bytes = dim * torch.empty(0, dtype=dtype).element_size()
        self.num_sets = capacity_bytes // (bytes_per_row(row_bytes) * WAYS)
        self.capacity_rows = self.num_sets * WAYS
        self.stats = CacheStats()
        self._rows = to_bits(torch.empty((self.capacity_rows, dim), dtype=dtype))
        self._keys = np.full((self.num_sets, WAYS), EMPTY, dtype=np.int64)
        # lru: the tick of the last use; lfu: the frequency (its estimate when it entered,
        # plus one per hit since, aged with the sketch), so victims need no sketch reads
        self._stamps = np.zeros((self.num_sets, WAYS), dtype=np.int64)
        self._born = np.zeros((self.num_sets, WAYS), dtype=np.int64)  # the step it was read at
        self._tick = 0
        width = max(1, SKETCH_WIDTH * self.capacity_rows)
        self._sketch = np.zeros((SKETCH_DEPTH, width), dtype=np.uint8)
        self._sketched = 0
        self.bytes_used = 0  # rows held x bytes_per_row
        self._row_cost = bytes_per_row(row_bytes)

    @property
    def enabled(self) -> bool:
        return self.capacity_rows > 0

    @property
    def capacity_bytes_used(self) -> int:
        """Bytes the cache has allocated (rows, keys, stamps, sketch): within its bound."""
        return self.capacity_rows * self._row_cost

    # -- hashing --------------------------------------------------------------------
    def _sets(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        mixed = keys.astype(np.uint64) * _SET_HASH
        return ((mixed >> np.uint64(32)) % np.uint64(self.num_sets)).astype(np.int64)

    def _sketch_cells(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        mixed = keys.astype(np.uint64)[None, :] * _SKETCH_HASHES[:, None]
        width = np.uint64(self._sketch.shape[1])
        return ((mixed >> np.uint64(29)) % width).astype(np.int64)

    def _estimate(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        cells = self._sketch_cells(keys.reshape(-1))
        counts = self._sketch[np.arange(SKETCH_DEPTH)[:, None], cells].min(axis=0)
        return counts.astype(np.int64).reshape(keys.shape)

    def _count(self, keys: npt.NDArray[np.int64]) -> None:
        cells = self._sketch_cells(keys)
        for depth in range(SKETCH_DEPTH):
            row, at = self._sketch[depth], cells[depth]
            # keys are unique, so a counter repeats only where two keys collide: one count
            row[at] = np.minimum(row[at].astype(np.uint16) + 1, SKETCH_MAX)
        self._sketched += len(keys)
        if self._sketched >= AGE_EVERY * self.capacity_rows:
            self._sketch >>= 1
            self._stamps >>= 1
            self._sketched = 0

    # -- batch operations -----------------------------------------------------------
    def lookup(
        self, keys: npt.NDArray[np.int64], *, read_since: int | None = None
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        """For unique ``keys``: (hit mask, row index of each hit) and the access counted.

        ``read_since``: rows read at an earlier step are too stale to serve; they
        are dropped and count as misses.
        """
        if not self.enabled:
            self.stats.misses += len(keys)
            return np.zeros(len(keys), dtype=np.bool_), np.empty(0, dtype=np.int64)
        sets = self._sets(keys)
        match = self._keys[sets] == keys[:, None]  # [n, WAYS]
        if read_since is not None:
            stale = match & (self._born[sets] < read_since)
            if stale.any():
                rows, ways = np.nonzero(stale)
                self._keys[sets[rows], ways] = EMPTY
                self.bytes_used -= len(rows) * self._row_cost
                match &= ~stale
        hit = match.any(axis=1)
        way = match.argmax(axis=1)[hit]
        hit_sets = sets[hit]
        self._tick += 1
        if self.policy == "lru":
            self._stamps[hit_sets, way] = self._tick
        else:
            self._count(keys)
            self._stamps[hit_sets, way] += 1
        hits = int(hit.sum())
        self.stats.hits += hits
        self.stats.misses += len(keys) - hits
        return hit, hit_sets * WAYS + way

    def rows(self, slots: npt.NDArray[np.int64]) -> np.ndarray:
        """The rows in ``slots`` (bits, see ``to_bits``)."""
        return self._rows[slots]

    def insert(self, keys: npt.NDArray[np.int64], rows: np.ndarray, step: int = 0) -> None:
        """Offer missed (unique, not cached) ``keys`` and their rows (bits), read at
        ``step``; the policy picks which enter."""
        if not self.enabled or not len(keys):
            return
        sets = self._sets(keys)
        lru = self.policy == "lru"
        # candidates of one set ranked best first; the r-th takes the set's r-th victim
        merit = np.zeros(len(keys), np.int64) if lru else self._estimate(keys)
        order = np.lexsort((-merit, sets))
        sets, keys_sorted, merit = sets[order], keys[order], merit[order]
        first = np.r_[0, np.flatnonzero(np.diff(sets)) + 1]
        rank = np.arange(len(sets)) - np.repeat(first, np.diff(np.r_[first, len(sets)]))
        keep = rank < WAYS
        self.stats.rejected += int((~keep).sum())  # more candidates than the set has slots
        sets, rank, keys_sorted, merit, order = (
            sets[keep], rank[keep], keys_sorted[keep], merit[keep], order[keep]
        )  # fmt: skip
        held = self._keys[sets]
        empty = held == EMPTY
        victim_merit = np.where(empty, -1, self._stamps[sets])
        ways = np.argsort(victim_merit, axis=1, kind="stable")[np.arange(len(sets)), rank]
        victim = victim_merit[np.arange(len(sets)), ways]
        admit = (victim < 0) | lru | (merit > victim)
        self.stats.rejected += int((~admit).sum())
        sets, ways, keys_sorted, order = sets[admit], ways[admit], keys_sorted[admit], order[admit]
        evicted = int((self._keys[sets, ways] != EMPTY).sum())
        self.stats.evictions += evicted
        self.stats.insertions += len(sets)
        self.bytes_used += (len(sets) - evicted) * self._row_cost
        self._keys[sets, ways] = keys_sorted
        self._stamps[sets, ways] = self._tick if lru else merit[admit]
        self._born[sets, ways] = step
        self._rows[sets * WAYS + ways] = rows[order]

    def clear(self) -> None:
        """Drop every row (the table moved to a newer version); frequencies stay."""
        self._keys.fill(EMPTY)
        self.bytes_used = 0
        self.stats.invalidations += 1
