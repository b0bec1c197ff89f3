"""The host cache: rows it serves are the rows it was given, bytes stay within the bound,
and each policy evicts and admits as documented."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recstore.client.host_cache import WAYS, bytes_per_row

from .host_cache_model import HostCache

DIM = 4
ROW_COST = bytes_per_row(DIM * 4)


def _rows(keys: np.ndarray) -> np.ndarray:
    """Each key's row: its value in every column (so a wrong row is easy to see)."""
    return np.repeat(keys.astype(np.float32)[:, None], DIM, axis=1)


def _read(cache: HostCache, keys: np.ndarray, step: int = 0) -> np.ndarray:
    hit, slots = cache.lookup(keys)
    out = np.empty((len(keys), DIM), np.float32)
    out[hit] = cache.rows(slots)
    out[~hit] = _rows(keys[~hit])
    cache.insert(keys[~hit], _rows(keys[~hit]), step)
    return out


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_rows_are_exact_and_bytes_bounded_on_a_skewed_trace(policy: str) -> None:
    budget = 64 * ROW_COST * WAYS // 8 + 123  # 64 rows and change
    cache = HostCache(budget, DIM, torch.float32, policy=policy)
    assert cache.capacity_rows == 64 and cache.capacity_bytes_used <= budget
    rng = np.random.default_rng(1)
    for _ in range(200):
        keys = np.unique(rng.zipf(1.3, 50) % 5000).astype(np.int64)
        np.testing.assert_array_equal(_read(cache, keys), _rows(keys))
        assert 0 <= cache.bytes_used <= cache.capacity_bytes_used
    stats = cache.stats
    assert stats.hits > 0 and stats.evictions > 0 and 0 < stats.hit_rate < 1


def test_lru_evicts_the_least_recently_used_row_of_the_set() -> None:
    cache = HostCache(WAYS * ROW_COST, DIM, torch.float32, policy="lru")  # one set
    first = np.arange(WAYS, dtype=np.int64)
    _read(cache, first)
    _read(cache, first[1:])  # key 0 is now the least recently used
    _read(cache, np.array([100], dtype=np.int64))
    hit, _ = cache.lookup(np.array([0, 1, 100], dtype=np.int64))
    assert hit.tolist() == [False, True, True]


def test_lfu_keeps_a_hot_row_from_one_off_keys() -> None:
    cache = HostCache(WAYS * ROW_COST, DIM, torch.float32, policy="lfu")
    hot = np.arange(WAYS, dtype=np.int64)
    for _ in range(5):
        _read(cache, hot)
    one_offs = np.arange(1000, 1000 + 4 * WAYS, dtype=np.int64)
    _read(cache, one_offs)
    assert cache.stats.rejected == len(one_offs)
    hit, _ = cache.lookup(hot)
    assert hit.all()


def test_rows_read_before_the_staleness_bound_are_misses() -> None:
    cache = HostCache(16 * ROW_COST, DIM, torch.float32)
    keys = np.array([1, 2], dtype=np.int64)
    _read(cache, keys, step=3)
    assert cache.lookup(keys, read_since=3)[0].all()
    hit, _ = cache.lookup(keys, read_since=4)
    assert not hit.any() and cache.bytes_used == 0


def test_a_cache_too_small_for_a_set_holds_nothing_and_misses() -> None:
    cache = HostCache(ROW_COST, DIM, torch.float32)
    assert not cache.enabled and cache.capacity_bytes_used == 0
    np.testing.assert_array_equal(_read(cache, np.array([3], np.int64)), _rows(np.array([3])))
    assert cache.stats.misses == 1


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="policy"):
        HostCache(1 << 20, DIM, torch.float32, policy="fifo")
    with pytest.raises(ValueError, match="host_cache_size"):
        HostCache(-1, DIM, torch.float32)


def test_the_numpy_model_is_a_test_oracle_not_part_of_the_package() -> None:
    """The product's caches run the policy in the engine and in torch; the numpy
    statement of it lives with the tests that compare them to it."""
    import recstore.client.host_cache as product

    assert not hasattr(product, "HostCache")
    assert HostCache.__module__.endswith("host_cache_model")
