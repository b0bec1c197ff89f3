"""How many rows one shard of a table holds: its share of the ids or of the capacity.

One rule for every place that sizes a shard: a node creating its engine
table for its start-up shard count (``recstore.store.options``), a target of
online resharding growing to the slots it will own, a provisioner
checking before a move that every target can hold what it will own, and a
pool's capacity check adding up what its tables reserve per node
(``recstore.core.pool_capacity``). The GPU cache a ``gpu_cache`` shard asks for
is sized here too, for the same readers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recstore.core.routing import NUM_SLOTS
from recstore.core.spec import DEFAULT_GPU_CACHE_FRACTION, KeyMode, TableSpec

#: Headroom of a dense shard's hash index over its fair share of ids: routing
#: by hash spreads ids unevenly over shards.
DENSE_SHARD_HEADROOM = 1.3


def rows_for_share(spec: TableSpec, owned: int, total: int) -> int:
    """Rows a shard holding ``owned`` of ``total`` equal parts of the table needs: its
    share of the ids (dense, with headroom for uneven routing) or of the capacity."""
    if spec.key_mode == KeyMode.dense:
        n = spec.num_embeddings
        return min(n, math.ceil(DENSE_SHARD_HEADROOM * n * owned / total) + 64)
    return math.ceil(spec.capacity * owned / total)


def rows_for_slots(spec: TableSpec, slots: int) -> int:
    """Rows a shard owning ``slots`` of the NUM_SLOTS routing slots needs."""
    return rows_for_share(spec, slots, NUM_SLOTS)


@dataclass(frozen=True)
class Layout:
    """How one shard addresses its rows."""

    direct: bool  # row == id
    id_limit: int  # > 0: ids must lie in [0, id_limit)
    capacity: int  # rows the shard holds


def shard_layout(spec: TableSpec, shard_index: int, num_shards: int) -> Layout:
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} is not in [0, num_shards={num_shards})")
    if spec.key_mode == KeyMode.dense:
        n = spec.num_embeddings
        if num_shards == 1:
            return Layout(direct=True, id_limit=n, capacity=n)
        return Layout(direct=False, id_limit=n, capacity=rows_for_share(spec, 1, num_shards))
    return Layout(direct=False, id_limit=0, capacity=rows_for_share(spec, 1, num_shards))


def cache_size(spec: TableSpec, shard_index: int, num_shards: int) -> tuple[int, int]:
    """(rows, bytes) one shard of a ``storage: gpu_cache`` table asks its cache for
    (one of them 0; the engine turns bytes into rows of the table).

    ``rows`` and ``bytes`` size the whole table's cache and are split evenly over
    the shards; without either, each shard caches 10% of the rows it holds.
    """
    cache = spec.cache
    if cache.rows is not None:
        return max(1, math.ceil(cache.rows / num_shards)), 0
    if cache.bytes is not None:
        return 0, cache.bytes // num_shards
    held = shard_layout(spec, shard_index, num_shards).capacity
    return max(1, math.ceil(DEFAULT_GPU_CACHE_FRACTION * held)), 0
