"""How a spec maps onto one shard's native layout, and the native routing hash."""

from __future__ import annotations

import numpy as np
import pytest

from recstore import _native
from recstore.core import TableSpec, hash_keys
from recstore.core.shard_rows import Layout, shard_layout


def spec(mode: str = "dense", n: int = 1000, capacity: int | None = None) -> TableSpec:
    return TableSpec(
        name="t", num_embeddings=n, embedding_dim=4, keys={"mode": mode, "capacity": capacity}
    )


@pytest.mark.parametrize(
    ("table", "shard", "shards", "expected"),
    [
        (spec(), 0, 1, Layout(direct=True, id_limit=1000, capacity=1000)),
        # ceil(1.3 * 1000 / 3) + 64 = 498 rows per shard, ids still checked against 1000
        (spec(), 2, 3, Layout(direct=False, id_limit=1000, capacity=498)),
        (spec(n=100), 1, 3, Layout(direct=False, id_limit=100, capacity=100)),  # capped at n
        (spec("hashed", capacity=1000), 0, 3, Layout(direct=False, id_limit=0, capacity=334)),
        (spec("hashed", n=50), 0, 1, Layout(direct=False, id_limit=0, capacity=50)),
    ],
)
def test_shard_layout(table: TableSpec, shard: int, shards: int, expected: Layout) -> None:
    assert shard_layout(table, shard, shards) == expected


@pytest.mark.parametrize(("shard", "shards"), [(1, 1), (-1, 2), (0, 0)])
def test_shard_index_must_lie_in_range(shard: int, shards: int) -> None:
    with pytest.raises(ValueError, match="shard_index"):
        shard_layout(spec(), shard, shards)


def test_native_routing_hash_equals_the_python_one() -> None:
    keys = np.array([0, 1, -1, 12345, -(2**63), 2**63 - 1, 987654321987], dtype=np.int64)
    assert [_native.fmix64(int(k)) for k in keys] == hash_keys(keys).tolist()
