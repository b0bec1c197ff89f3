"""A pure-Python model of the gpu_cache tier's set-associative LRU directory.

Written from the rules in csrc/cache_sets.h, independently of the engine: a
lookup call gets the next tick; its distinct keys are grouped by set (set
ascending, keys ascending within a set); hits are stamped, then each missing
key takes the way with the smallest (tick, way) not stamped by this call (an
empty way has tick 0), or bypasses the cache when there is none. Hits and
misses count every occurrence of a key in the call.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

MASK = (1 << 64) - 1


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def set_of(key: int, sets: int) -> int:
    return (splitmix64((key & MASK) ^ 0xC2B2AE3D27D4EB4F) * sets) >> 64


class CacheModel:
    def __init__(self, sets: int, ways: int) -> None:
        self.sets, self.ways = sets, ways
        self.keys = [0] * (sets * ways)
        self.ticks = [0] * (sets * ways)
        self.tick = 0
        self.hits = self.misses = self.evictions = 0

    def _find(self, key: int) -> int:
        base = set_of(key, self.sets) * self.ways
        for slot in range(base, base + self.ways):
            if self.ticks[slot] and self.keys[slot] == key:
                return slot
        return -1

    def lookup(self, batch: Iterable[int]) -> None:
        batch = [int(k) for k in batch]
        self.tick += 1
        by_set: dict[int, list[int]] = defaultdict(list)
        for key in sorted(set(batch)):
            by_set[set_of(key, self.sets)].append(key)
        hit = {key: self._find(key) >= 0 for key in set(batch)}
        for s in sorted(by_set):
            base = s * self.ways
            for key in by_set[s]:
                if hit[key]:
                    self.ticks[self._find(key)] = self.tick
            for key in by_set[s]:
                if hit[key]:
                    continue
                free = [w for w in range(self.ways) if self.ticks[base + w] < self.tick]
                if not free:
                    continue
                way = min(free, key=lambda w: (self.ticks[base + w], w))
                if self.ticks[base + way]:
                    self.evictions += 1
                self.keys[base + way], self.ticks[base + way] = key, self.tick
        for key in batch:
            if hit[key]:
                self.hits += 1
            else:
                self.misses += 1

    def erase(self, keys: Iterable[int]) -> None:
        for key in keys:
            slot = self._find(int(key))
            if slot >= 0:
                self.ticks[slot] = 0

    def resident(self) -> dict[int, int]:
        """slot -> key of every live slot."""
        return {s: k for s, (k, t) in enumerate(zip(self.keys, self.ticks, strict=True)) if t}
