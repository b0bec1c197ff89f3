"""The GPU cache of a ``Hierarchical`` NVE layer: table rows resident on the layer's device.

A lookup that hits here never leaves the device; only the misses go down to
the host cache and the table (``device_cache_tiers``). The tier runs the host
cache's policy (``recstore.client.host_cache``) step for step, in torch, so one
rule governs both tiers and the policy's numpy model
(``tests/client/host_cache_model.py``) is this tier's oracle: set-associative
(``WAYS`` slots per set, the same set hash), ``"lfu"`` with TinyLFU admission
(the same count-min sketch, aging and victim ranking) or ``"lru"``, the same
tie-breaks. Every tensor lives on ``device`` and every operation is a batch of
torch ops, so the code that runs on a GPU is the code the tests run on CPU
tensors.

Bytes: rows, keys, a use stamp and a read step per slot and the sketch stay
within ``capacity_bytes`` (``bytes_per_row``, the host cache's accounting).
"""

from __future__ import annotations

from typing import Any

import numpy as np
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
)

EMPTY = -1  # the key of an empty slot (table keys are >= 0)


def _signed(value: int | np.integer) -> int:
    """A uint64 hash constant as the int64 with the same bits (torch multiplies int64,
    wrapping, which keeps the low 64 bits of the unsigned product)."""
    value = int(value)
    return value - (1 << 64) if value >= 1 << 63 else value


_SET_MUL = _signed(_SET_HASH)
_SKETCH_MULS = [_signed(h) for h in _SKETCH_HASHES]
_LOW32 = (1 << 32) - 1
_LOW35 = (1 << 35) - 1  # what a logical shift right by 29 keeps of 64 bits


def tier_sets(capacity_bytes: int, dim: int, dtype: torch.dtype) -> int:
    """Sets of ``WAYS`` rows that ``capacity_bytes`` holds; ValueError unless at least one."""
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
        raise TypeError(f"gpu_cache_size must be an int of bytes, got {capacity_bytes!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"the GPU cache holds floating-point rows, got {dtype}")
    row_bytes = dim * torch.empty(0, dtype=dtype).element_size()
    set_bytes = bytes_per_row(row_bytes) * WAYS
    if capacity_bytes < set_bytes:
        raise ValueError(
            f"gpu_cache_size={capacity_bytes} bytes holds no set of {WAYS} rows of "
            f"{row_bytes} bytes; the GPU cache needs at least {set_bytes} bytes "
            f"({bytes_per_row(row_bytes)} per row: values, key, stamps, sketch)"
        )
    return capacity_bytes // set_bytes


class DeviceRowCache:
    """Rows of one table keyed by int64 id, on ``device``, within ``capacity_bytes``."""

    def __init__(
        self,
        capacity_bytes: int,
        dim: int,
        dtype: torch.dtype,
        device: Any,
        *,
        policy: str = "lfu",
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"cache policy must be one of {POLICIES}, got {policy!r}")
        if dim < 1:
            raise ValueError(f"rows need at least one value, got dim={dim}")
        self.num_sets = tier_sets(capacity_bytes, dim, dtype)
        self.policy, self.dim, self.dtype = policy, dim, dtype
        self.device = torch.device(device)
        self.capacity_rows = self.num_sets * WAYS
        self._row_cost = bytes_per_row(dim * torch.empty(0, dtype=dtype).element_size())
        self.stats = CacheStats()
        on, slots = self.device, (self.num_sets, WAYS)
        self._rows = torch.empty((self.capacity_rows, dim), dtype=dtype, device=on)
        self._keys = torch.full(slots, EMPTY, dtype=torch.int64, device=on)
        # lru: the tick of the last use; lfu: the frequency (as the host cache keeps it)
        self._stamps = torch.zeros(slots, dtype=torch.int64, device=on)
        self._born = torch.zeros(slots, dtype=torch.int64, device=on)  # the step it was read at
        width = SKETCH_WIDTH * self.capacity_rows
        self._sketch = torch.zeros((SKETCH_DEPTH, width), dtype=torch.uint8, device=on)
        self._tick = 0
        self._sketched = 0
        self._resident = 0

    @property
    def resident_rows(self) -> int:
        return self._resident

    @property
    def bytes_used(self) -> int:
        """Rows held x bytes each (their values, key, stamps and sketch share)."""
        return self._resident * self._row_cost

    @property
    def capacity_bytes_used(self) -> int:
        """Bytes the tier allocated: within ``capacity_bytes``."""
        return self.capacity_rows * self._row_cost

    # -- hashing (the host cache's, in int64 arithmetic) ---------------------------------
    def _sets(self, keys: torch.Tensor) -> torch.Tensor:
        return ((keys * _SET_MUL) >> 32 & _LOW32) % self.num_sets

    def _sketch_cells(self, keys: torch.Tensor) -> torch.Tensor:
        width = self._sketch.shape[1]
        return torch.stack([(keys * mul >> 29 & _LOW35) % width for mul in _SKETCH_MULS])

    def _estimate(self, keys: torch.Tensor) -> torch.Tensor:
        counts = self._sketch.gather(1, self._sketch_cells(keys))
        return counts.min(dim=0).values.to(torch.int64)

    def _count(self, keys: torch.Tensor) -> None:
        cells = self._sketch_cells(keys)
        for depth in range(SKETCH_DEPTH):
            row, at = self._sketch[depth], cells[depth]
            # keys are unique: a counter repeats only where two keys collide, one count
            row[at] = (row[at].to(torch.int16) + 1).clamp_max(SKETCH_MAX).to(torch.uint8)
        self._sketched += keys.numel()
        if self._sketched >= AGE_EVERY * self.capacity_rows:
            self._sketch.bitwise_right_shift_(1)
            self._stamps.bitwise_right_shift_(1)
            self._sketched = 0

    # -- batch operations -----------------------------------------------------------
    def lookup(
        self, keys: torch.Tensor, *, read_since: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """For unique int64 ``keys`` on the device: (hit mask, slot of each hit), the access
        counted. ``read_since``: rows read at an earlier step are dropped and miss."""
        sets = self._sets(keys)
        match = self._keys[sets] == keys[:, None]  # [n, WAYS]
        if read_since is not None:
            stale = match & (self._born[sets] < read_since)
            at, ways = stale.nonzero(as_tuple=True)
            if at.numel():
                self._keys[sets[at], ways] = EMPTY
                self._resident -= at.numel()
                match &= ~stale
        hit = match.any(dim=1)
        way = match.to(torch.int32).argmax(dim=1)[hit]
        hit_sets = sets[hit]
        self._tick += 1
        if self.policy == "lru":
            self._stamps[hit_sets, way] = self._tick
        else:
            self._count(keys)
            self._stamps[hit_sets, way] += 1
        hits = int(hit_sets.numel())
        self.stats.hits += hits
        self.stats.misses += keys.numel() - hits
        return hit, hit_sets * WAYS + way

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        return self._rows.index_select(0, slots)

    def insert(self, keys: torch.Tensor, rows: torch.Tensor, step: int | torch.Tensor = 0) -> None:
        """Offer missed (unique, not cached) ``keys`` and their ``rows``, read at ``step``
        (one for all, or one per key); the policy picks which enter."""
        if not keys.numel():
            return
        lru = self.policy == "lru"
        sets = self._sets(keys)
        merit = torch.zeros_like(keys) if lru else self._estimate(keys)
        # by set, best first within a set, ties in key order (the host cache model's lexsort)
        by_merit = torch.argsort(-merit, stable=True)
        order = by_merit[torch.argsort(sets[by_merit], stable=True)]
        sets, merit = sets[order], merit[order]
        at = torch.arange(sets.numel(), device=self.device)
        starts = torch.ones_like(sets, dtype=torch.bool)
        starts[1:] = sets[1:] != sets[:-1]
        rank = at - torch.cummax(torch.where(starts, at, 0), dim=0).values
        keep = rank < WAYS  # the r-th candidate of a set takes the set's r-th victim
        self.stats.rejected += int((~keep).sum())
        sets, merit, order, rank = sets[keep], merit[keep], order[keep], rank[keep]
        victim_merit = torch.where(self._keys[sets] == EMPTY, -1, self._stamps[sets])
        line = torch.arange(sets.numel(), device=self.device)
        ways = torch.argsort(victim_merit, dim=1, stable=True)[line, rank]
        victim = victim_merit[line, ways]
        if lru:  # every missed key enters
            admit = torch.ones_like(victim, dtype=torch.bool)
        else:  # TinyLFU: only when estimated more frequent than its victim
            admit = (victim < 0) | (merit > victim)
        self.stats.rejected += int((~admit).sum())
        sets, ways, merit, order = sets[admit], ways[admit], merit[admit], order[admit]
        evicted = int((self._keys[sets, ways] != EMPTY).sum())
        self.stats.evictions += evicted
        self.stats.insertions += sets.numel()
        self._resident += sets.numel() - evicted
        self._keys[sets, ways] = keys[order]
        self._stamps[sets, ways] = self._tick if lru else merit
        self._born[sets, ways] = step[order] if isinstance(step, torch.Tensor) else step
        self._rows[sets * WAYS + ways] = rows[order].to(self.dtype)

    def recount_hits(self, n: int) -> None:
        """``n`` hits of the last lookup were not served after all (the table moved on)."""
        self.stats.hits -= n
        self.stats.misses += n

    def clear(self) -> None:
        """Drop every row (the table moved to a newer version); frequencies stay."""
        self._keys.fill_(EMPTY)
        self._resident = 0
        self.stats.invalidations += 1

    def directory(self) -> tuple[np.ndarray, np.ndarray]:
        """(key, stamp) of every slot, set by set (empty: key -1), for model checks."""
        return self._keys.cpu().numpy(), self._stamps.cpu().numpy()
