"""How many rows one shard of a table holds: its share of the ids or of the capacity.

One rule for every place that sizes a shard: a node creating its engine
table for its start-up shard count (``recstore.store.options``), a target of
online resharding growing to the slots it will own, and a provisioner
checking before a move that every target can hold what it will own.
"""

from __future__ import annotations

import math

from recstore.core.routing import NUM_SLOTS
from recstore.core.spec import KeyMode, TableSpec

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
