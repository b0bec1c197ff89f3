"""Growing a hashed shard while it serves (``Table.reserve``): rows, state and index intact.

Online resharding grows a target's table to the slots it will own; the copy
happens under the table's exclusive lock, so concurrent pulls and updates
either run before it or see the grown arenas. Each kind that grows (dense
shards of a multi-shard table, hashed tables, with and without eviction)
must keep every row's value, optimizer state and bookkeeping.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from recstore.core import CapacityExhausted, TableSpec
from recstore.store import Table


def _spec(**fields: object) -> TableSpec:
    base: dict[str, object] = {"name": "grow", "num_embeddings": 4000, "embedding_dim": 16}
    return TableSpec.model_validate(base | fields)


KINDS = {
    "dense-shard": ({"optimizer": {"kind": "adam", "lr": 0.1}}, 4),
    "hashed": ({"keys": {"mode": "hashed", "capacity": 4000}, "optimizer": {"kind": "adagrad"}}, 4),
    "hashed-lru": ({"keys": {"mode": "hashed", "capacity": 4000, "eviction": "lru"}}, 4),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_reserve_keeps_every_row_and_its_state(kind: str) -> None:
    fields, shards = KINDS[kind]
    table = Table(_spec(**fields), shard_index=0, num_shards=shards)
    small = table.capacity
    keys = np.arange(0, small - 10, dtype=np.int64) * 3 % 4000
    rng = np.random.default_rng(0)
    table.update(keys, rng.normal(size=(len(keys), 16)).astype(np.float32), lr=0.5)
    table.erase(keys[:7])  # freed rows are reused after the growth too
    before = table.export_keys(np.sort(keys))
    assert table.reserve(2 * small) and table.capacity == 2 * small
    assert not table.reserve(small)  # holds that many already
    after = table.export_keys(np.sort(keys))
    np.testing.assert_array_equal(after.keys, before.keys)
    np.testing.assert_array_equal(after.values, before.values)
    np.testing.assert_array_equal(after.state, before.state)
    fresh = np.setdiff1d(np.arange(4000, dtype=np.int64), keys)[:small]
    table.pull(fresh)  # more new keys than the old size: they fit now
    assert table.size == len(keys) - 7 + len(fresh)
    np.testing.assert_array_equal(table.export_keys(np.sort(keys)).values, before.values)
    assert table.stats()["evictions"] == 0


def test_a_dense_shard_grows_to_its_ids_at_most() -> None:
    table = Table(_spec(), shard_index=1, num_shards=4)
    assert table.reserve(10**6) and table.capacity == 4000
    table.pull(np.arange(4000, dtype=np.int64))
    assert table.size == 4000


def test_a_full_table_refuses_then_grows() -> None:
    table = Table(_spec(keys={"mode": "hashed", "capacity": 400}), shard_index=0, num_shards=4)
    with pytest.raises(CapacityExhausted, match="table is full"):
        table.pull(np.arange(150, dtype=np.int64))
    assert table.size == 0  # refused whole
    table.reserve(150)
    table.pull(np.arange(150, dtype=np.int64))
    assert table.size == 150


def test_growth_while_pulls_and_updates_run() -> None:
    # one row per key, each a running sum of unit SGD steps: any lost or torn write shows
    spec = _spec(optimizer={"kind": "sgd", "lr": 1.0}, initializer={"kind": "zeros"})
    table = Table(spec, shard_index=0, num_shards=8)
    keys = np.arange(0, table.capacity - 1, dtype=np.int64)
    table.pull(keys)
    steps, errors = 200, []
    started = threading.Barrier(3)

    def writer() -> None:
        started.wait()
        for _ in range(steps):
            table.update(keys, np.ones((len(keys), 16), np.float32), lr=1.0)

    def reader() -> None:
        started.wait()
        for _ in range(steps):
            rows = table.pull(keys)
            if not (rows == rows[:, :1]).all():
                errors.append("a torn row")

    threads = [threading.Thread(target=f) for f in (writer, reader)]
    for thread in threads:
        thread.start()
    started.wait()
    capacity = table.capacity
    for _ in range(5):
        capacity *= 2
        table.reserve(min(capacity, 4000))
    for thread in threads:
        thread.join()
    assert not errors
    np.testing.assert_array_equal(table.pull(keys), np.full((len(keys), 16), -steps, np.float32))
    assert table.capacity == 4000
