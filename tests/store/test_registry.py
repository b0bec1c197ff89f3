"""Store: one table per name, same spec returns it, another spec is refused."""

from __future__ import annotations

import numpy as np
import pytest

from recstore import _native
from recstore.core import TableExists, TableNotFound, TableSpec
from recstore.store import Store, Table


def spec(name: str = "emb", dim: int = 4) -> TableSpec:
    return TableSpec(name=name, num_embeddings=100, embedding_dim=dim)


def test_create_get_drop_names() -> None:
    store = Store()
    table = store.create(spec())
    assert store.create(spec()) is table
    assert store.get("emb") is table
    store.create(spec("other"))
    assert store.names() == ["emb", "other"]
    store.drop("emb")
    assert store.names() == ["other"]
    with pytest.raises(TableNotFound):
        store.get("emb")
    with pytest.raises(TableNotFound):
        store.drop("emb")


def test_another_spec_under_the_same_name_is_refused() -> None:
    store = Store()
    store.create(spec())
    with pytest.raises(TableExists):
        store.create(spec(dim=8))
    with pytest.raises(TableExists):
        store.create(spec(), shard_index=1, num_shards=2)


def test_table_describes_itself() -> None:
    t = Store().create(spec(), shard_index=1, num_shards=3)
    assert (t.name, t.dim, t.dtype.value, t.device, t.shard_index, t.num_shards) == (
        "emb",
        4,
        "float32",
        "cpu",
        1,
        3,
    )
    assert t.capacity == 100  # ceil(1.3 * 100 / 3) + 64 capped at num_embeddings
    t.pull(np.array([5, 6], np.int64))
    stats = t.stats()
    assert stats["size"] == t.size == 2
    assert stats["memory_bytes"] == t.memory_bytes > 100 * 4 * 4


def test_hashed_index_costs_at_most_16_bytes_per_row() -> None:
    t = Table(
        TableSpec(
            name="h",
            num_embeddings=10**12,
            embedding_dim=8,
            keys={"mode": "hashed", "capacity": 100_000},
        )
    )
    assert t.stats()["index_bytes"] / t.capacity <= 16


@pytest.mark.skipif(_native.cuda_available(), reason="a GPU is present")
def test_cuda_tables_need_a_cuda_build_and_device() -> None:
    with pytest.raises(RuntimeError, match="CUDA"):
        Table(spec(), device="cuda")


def test_rows_cost_memory_only_once_written() -> None:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = Table(
        TableSpec(
            name="big", num_embeddings=100_000_000, embedding_dim=8, initializer={"kind": "zeros"}
        )
    )
    t.pull(np.array([5, 99_999_999], np.int64))
    assert t.memory_bytes > 3 * 2**30  # reserved: 100M rows x 32 bytes, plus residency bytes
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 256 * 1024


def test_a_table_too_large_for_the_host_is_a_clear_memory_error() -> None:
    with pytest.raises(MemoryError, match="cannot reserve"):
        Table(TableSpec(name="huge", num_embeddings=2**60, embedding_dim=8192))
