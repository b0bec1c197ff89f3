"""Hashed tables: which row goes when full (LRU, LFU, TTL first), and none without a policy."""

from __future__ import annotations

import numpy as np
import pytest

from recstore.core import CapacityExhausted, TableSpec
from recstore.store import Table


def hashed(eviction: str, capacity: int = 3, ttl: float | None = None) -> TableSpec:
    keys = {"mode": "hashed", "capacity": capacity, "eviction": eviction, "ttl_seconds": ttl}
    return TableSpec(name="h", num_embeddings=1000, embedding_dim=2, keys=keys)


def ids(*keys: int) -> np.ndarray:
    return np.array(keys, dtype=np.int64)


def resident(table: Table) -> set[int]:
    return {int(k) for c in table.export_chunks() for k in c.keys}


def test_lru_evicts_the_least_recently_pulled_or_updated_row() -> None:
    table = Table(hashed("lru"))
    table.pull(ids(1, 2, 3))
    table.update(ids(1), np.ones((1, 2), np.float32))  # 2 is now the oldest
    table.pull(ids(4))
    assert resident(table) == {1, 3, 4}
    table.find(ids(3))  # find does not count as a use
    table.pull(ids(5))
    assert resident(table) == {1, 4, 5}
    assert table.stats()["evictions"] == 2


def test_within_one_call_the_last_position_counts() -> None:
    table = Table(hashed("lru"))
    table.pull(ids(1, 2, 3, 1))  # order of last use: 2, 3, 1
    table.pull(ids(9))
    assert resident(table) == {1, 3, 9}


def test_lfu_evicts_the_least_frequently_used_row_oldest_first_on_ties() -> None:
    table = Table(hashed("lfu"))
    table.pull(ids(1, 2, 3))
    table.pull(ids(1, 3))
    table.pull(ids(3))
    table.pull(ids(4))  # 2 has one use
    assert resident(table) == {1, 3, 4}
    table.pull(ids(5))  # 4 has one use, 1 has two
    assert resident(table) == {1, 3, 5}


def test_rows_of_the_current_call_are_never_evicted() -> None:
    table = Table(hashed("lru", capacity=2))
    table.pull(ids(1, 2))
    out = table.pull(ids(1, 7))  # 2 must go, not 1
    assert resident(table) == {1, 7}
    np.testing.assert_array_equal(out[0], table.find(ids(1))[0][0])
    with pytest.raises(CapacityExhausted):
        table.pull(ids(8, 9, 10))  # three new keys never fit in two rows
    assert resident(table) == {1, 7}


def test_without_eviction_a_full_table_refuses_and_changes_nothing() -> None:
    table = Table(hashed("none"))
    table.pull(ids(1, 2))
    before = table.find(ids(1, 2))[0].copy()
    with pytest.raises(CapacityExhausted):
        table.update(ids(1, 3, 4), np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(table.find(ids(1, 2))[0], before)
    assert table.size == 2 and table.optimizer_state()["step"] == 0
    table.pull(ids(3))  # exactly full still works
    assert table.size == 3


def test_expired_rows_go_before_any_live_row() -> None:
    now = [100.0]
    table = Table(hashed("lfu", ttl=10.0), clock=lambda: now[0])
    table.pull(ids(1))
    now[0] = 105.0
    table.pull(ids(2, 2))
    table.pull(ids(2, 3))
    now[0] = 111.0  # 1 expired (11 s); 2 (three uses) and 3 (one use) are live
    assert table.find(ids(1))[1].tolist() == [False]
    table.pull(ids(4))
    assert resident(table) == {2, 3, 4}
    assert table.stats()["expirations"] == 1


def test_ttl_without_eviction_frees_only_expired_rows_and_expire_sweeps() -> None:
    now = [0.0]
    table = Table(hashed("none", capacity=2, ttl=5.0), clock=lambda: now[0])
    table.pull(ids(1, 2))
    with pytest.raises(CapacityExhausted):
        table.pull(ids(3))
    now[0] = 6.0
    table.pull(ids(3))  # one expired row made room
    assert table.size == 2
    now[0] = 12.0
    assert table.expire() == 2
    assert table.size == 0


def test_an_expired_row_pulled_again_starts_from_its_initial_value() -> None:
    now = [0.0]
    table = Table(hashed("lru", ttl=5.0), clock=lambda: now[0])
    first = table.pull(ids(1)).copy()
    table.update(ids(1), np.ones((1, 2), np.float32))
    assert not np.array_equal(table.pull(ids(1)), first)
    now[0] = 100.0
    np.testing.assert_array_equal(table.pull(ids(1)), first)
