"""bench/cache_hit_bench.py's Belady MIN (the engine's: a heap with lazy deletion whose stale
entries are dropped) against a brute-force MIN, and the bench's lookups and scores."""

from __future__ import annotations

import bisect
import importlib.util
from pathlib import Path

import numpy as np
import pytest

SPEC = importlib.util.spec_from_file_location(
    "cache_hit_bench", Path(__file__).resolve().parents[2] / "bench" / "cache_hit_bench.py"
)
assert SPEC is not None and SPEC.loader is not None
cache_hit_bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(cache_hit_bench)


def _brute_force_min(sequence: list[int], capacity: int) -> int:
    """MIN with bypass, by a search for the farthest next use at every miss."""
    positions: dict[int, list[int]] = {}
    for position, key in enumerate(sequence):
        positions.setdefault(key, []).append(position)

    def next_use(key: int, after: int) -> int:
        later = positions[key]
        at = bisect.bisect_right(later, after)
        return later[at] if at < len(later) else len(sequence)

    cached: set[int] = set()
    hits = 0
    for position, key in enumerate(sequence):
        if key in cached:
            hits += 1
            continue
        mine = next_use(key, position)
        if mine == len(sequence) or capacity == 0:
            continue
        if len(cached) < capacity:
            cached.add(key)
            continue
        victim = max(cached, key=lambda k: next_use(k, position))
        if next_use(victim, position) > mine:
            cached.remove(victim)
            cached.add(key)
    return hits


@pytest.mark.parametrize("capacity", [0, 1, 3, 8])
def test_heap_min_matches_the_brute_force(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    for _ in range(20):
        sequence = (rng.zipf(1.3, 60) % 20).astype(np.int64)
        expected = _brute_force_min(sequence.tolist(), capacity)
        assert cache_hit_bench.belady_hits(sequence, capacity) == expected


@pytest.mark.parametrize("capacity", [1, 4])
def test_min_stays_exact_when_its_stale_heap_entries_are_dropped(capacity: int) -> None:
    # hits of a few hot keys push an entry each: past ~4 x capacity + 1024 entries
    # the heap is compacted, many times over on this sequence
    rng = np.random.default_rng(7)
    sequence = np.where(rng.random(20_000) < 0.9, rng.integers(0, 3, 20_000),
                        rng.integers(3, 400, 20_000)).astype(np.int64)  # fmt: skip
    expected = _brute_force_min(sequence.tolist(), capacity)
    assert cache_hit_bench.belady_hits(sequence, capacity) == expected


def test_min_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="keys must be >= 0, got -1 at 1"):
        cache_hit_bench.belady_hits(np.array([3, -1], dtype=np.int64), 2)
    with pytest.raises(ValueError, match="capacity must be >= 0, got -2"):
        cache_hit_bench.belady_hits(np.array([3, 1], dtype=np.int64), -2)
    with pytest.raises(TypeError, match="keys"):
        cache_hit_bench.belady_hits(np.array([3, 1], dtype=np.int32), 2)


def test_lookups_hand_the_cache_each_distinct_id_once_with_its_count() -> None:
    batches, counts = cache_hit_bench.lookups(np.array([4, 2, 4, 4, 9, 2, 9, 7]), 4)
    assert [b.tolist() for b in batches] == [[4, 2], [9, 2, 7]]
    assert counts.tolist() == [3, 1, 2, 1, 1]
    batches, counts = cache_hit_bench.lookups(np.array([5, 5, 1, 0, 1, 1, 8], dtype=np.int64), 3)
    assert [b.tolist() for b in batches] == [[5, 1], [0, 1], [8]]
    assert counts.tolist() == [2, 1, 1, 2, 1]


def test_scores_weigh_each_hit_by_its_occurrences_and_count_the_window_alone() -> None:
    hit = np.array([False, True, True, False])
    counts = np.array([1, 3, 1, 5])
    scores = cache_hit_bench._scores(hit, counts, slice(2, 4))
    assert scores == {
        "whole_distinct": 0.5, "whole_ids": 0.4, "window_distinct": 0.5, "window_ids": 1 / 6,
    }  # fmt: skip


def test_min_hit_mask_marks_the_hits_belady_hits_counts() -> None:
    sequence = np.array([1, 2, 1, 3, 2, 1, 3, 3])
    mask = cache_hit_bench.belady_hit_mask(sequence, 1)
    assert mask.tolist() == [False, False, True, False, False, True, False, True]
    assert cache_hit_bench.belady_hits(sequence, 1) == 3
