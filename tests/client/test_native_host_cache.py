"""The engine's host cache against the numpy model: after every call of a skewed
sequence (lookups with and without a staleness bound, inserts, invalidations) both
serve the same rows, hold the same keys in the same slots with the same stamps, and
count the same; bad arrays are refused before anything changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recstore.client.host_cache import WAYS, bytes_per_row
from recstore.client.native_host_cache import NativeHostCache

from .host_cache_model import HostCache

DIM = 4
ROW_COST = bytes_per_row(DIM * 4)


def _rows(keys: np.ndarray) -> np.ndarray:
    return (keys[:, None] * DIM + np.arange(DIM)).astype(np.float32)


def _zipf_batches(seed: int, batches: int, batch: int, rows: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        ids = np.minimum(rng.zipf(1.1, batch), rows) - 1
        ids = rng.permutation(rows)[ids] if seed % 2 else ids
        _, first = np.unique(ids, return_index=True)
        out.append(ids[np.sort(first)].astype(np.int64))
    return out


def _same_state(model: HostCache, native: NativeHostCache) -> None:
    keys, stamps = native.directory()
    np.testing.assert_array_equal(keys, model._keys)
    held = model._keys != -1
    np.testing.assert_array_equal(stamps[held], model._stamps[held])
    assert native.stats == model.stats
    assert native.bytes_used == model.bytes_used


@pytest.mark.parametrize("policy", ["lfu", "lru"])
@pytest.mark.parametrize("sets", [1, 3, 64])
def test_native_cache_matches_the_numpy_model(policy: str, sets: int) -> None:
    budget = sets * WAYS * ROW_COST
    model = HostCache(budget, DIM, torch.float32, policy=policy)
    native = NativeHostCache(budget, DIM, torch.float32, policy=policy)
    assert native.capacity_rows == model.capacity_rows == sets * WAYS
    for step, keys in enumerate(_zipf_batches(sets, 120, 300, 5000)):
        since = step - 3 if step % 5 == 4 else None
        hit, slots = model.lookup(keys, read_since=since)
        out = native.empty_rows(len(keys))
        miss = native.lookup_into(keys, out, read_since=since)
        np.testing.assert_array_equal(miss, np.flatnonzero(~hit))
        np.testing.assert_array_equal(out[hit], model.rows(slots))
        np.testing.assert_array_equal(out[hit], _rows(keys[hit]))
        model.insert(keys[miss], _rows(keys[miss]), step)
        native.insert(keys[miss], _rows(keys[miss]), step)
        if step % 37 == 36:
            model.clear()
            native.clear()
        _same_state(model, native)


def test_a_cache_too_small_for_a_set_misses_everything() -> None:
    native = NativeHostCache(ROW_COST, DIM, torch.float32)
    keys = np.arange(5, dtype=np.int64)
    assert not native.enabled
    np.testing.assert_array_equal(native.lookup_into(keys, native.empty_rows(5)), np.arange(5))
    native.insert(keys, _rows(keys))
    assert native.stats.misses == 5 and native.bytes_used == 0


def test_bad_arrays_are_refused_and_nothing_changes() -> None:
    native = NativeHostCache(WAYS * ROW_COST, DIM, torch.float32)
    keys = np.arange(3, dtype=np.int64)
    with pytest.raises(ValueError, match=r"out must have shape \(3, 16\)"):
        native.lookup_into(keys, native.empty_rows(2))
    with pytest.raises(TypeError, match="keys"):
        native.lookup_into(keys.astype(np.int32), native.empty_rows(3))
    with pytest.raises(ValueError, match=r"rows must have shape \(3, 16\)"):
        native.insert(keys, _rows(keys[:2]))
    with pytest.raises(TypeError, match="rows must be float32"):
        native.insert(keys, _rows(keys).astype(np.float64))
    assert native.stats.misses == 0 and native.bytes_used == 0
    with pytest.raises(ValueError, match="policy"):
        NativeHostCache(1 << 20, DIM, torch.float32, policy="fifo")
    with pytest.raises(ValueError, match="host_cache_size"):
        NativeHostCache(-1, DIM, torch.float32)


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_gather_and_fill_are_the_models_lookup_and_insert_of_the_distinct_keys(
    policy: str,
) -> None:
    budget = 16 * WAYS * ROW_COST
    model = HostCache(budget, DIM, torch.float32, policy=policy)
    native = NativeHostCache(budget, DIM, torch.float32, policy=policy)
    rng = np.random.default_rng(3)
    for step in range(60):
        keys = (np.minimum(rng.zipf(1.1, 400), 3000) - 1).astype(np.int64)  # repeats
        since = step - 2 if step % 4 == 3 else None
        _, first = np.unique(keys, return_index=True)
        distinct = keys[np.sort(first)]  # first occurrence first, as the layer sees them
        hit, _ = model.lookup(distinct, read_since=since)
        out = native.empty_rows(len(keys))
        misses, miss_of = native.gather(keys, out, read_since=since)
        np.testing.assert_array_equal(misses, distinct[~hit])
        served = miss_of < 0
        assert set(keys[served]) == set(distinct[hit])
        np.testing.assert_array_equal(misses[miss_of[~served]], keys[~served])
        np.testing.assert_array_equal(out[served], _rows(keys[served]))
        model.insert(misses, _rows(misses), step)
        native.fill(miss_of, out, misses, _rows(misses), step)
        np.testing.assert_array_equal(out, _rows(keys))  # every position, hit or fetched
        if step % 13 == 12:
            model.clear()
            native.clear()
        _same_state(model, native)


def test_fill_offers_the_misses_in_chunks_of_max_modify_size() -> None:
    budget = 4 * WAYS * ROW_COST
    model = HostCache(budget, DIM, torch.float32)
    native = NativeHostCache(budget, DIM, torch.float32)
    keys = np.arange(100, dtype=np.int64)
    model.lookup(keys)
    misses, miss_of = native.gather(keys, native.empty_rows(100))
    for start in range(0, 100, 9):
        model.insert(keys[start : start + 9], _rows(keys[start : start + 9]))
    native.fill(miss_of, native.empty_rows(100), misses, _rows(misses), 0, chunk=9)
    _same_state(model, native)


def test_fill_refuses_a_bad_miss_index_and_writes_nothing() -> None:
    native = NativeHostCache(WAYS * ROW_COST, DIM, torch.float32)
    keys = np.array([5, 6, 5], dtype=np.int64)
    out = native.empty_rows(3)
    misses, miss_of = native.gather(keys, out)
    np.testing.assert_array_equal(misses, [5, 6])
    np.testing.assert_array_equal(miss_of, [0, 1, 0])
    out[:] = 0
    with pytest.raises(ValueError, match=r"miss_of\[1\] = 2 is not in \[-1, 2\)"):
        native.fill(np.array([0, 2, 0]), out, misses, _rows(misses))
    with pytest.raises(ValueError, match=r"rows must have shape \(2, 16\)"):
        native.fill(miss_of, out, misses, _rows(misses[:1]))
    np.testing.assert_array_equal(out, 0)
    assert native.stats.insertions == 0 and native.bytes_used == 0
