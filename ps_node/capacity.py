"""How many rows a shard's engine table holds, when its slots are not its start-up share.

A node sizes each table for its share of the start-up shard count. Online
resharding hands a kept node more slots than that (a shrink empties the
highest shards into the lower ones), so a target grows its table before
importing (``recstore.ps.reshard.steps``), to what it will own
(``rows_for_slots``: its share of the ids or of the capacity, never the whole
table), and records the size in the catalogue: a restarted node creates the
table that large before it replays the log or loads a checkpoint.
"""

from __future__ import annotations

import numpy as np

from recstore.core.routing import SlotMap
from recstore.core.shard_rows import rows_for_slots
from recstore.ps.catalogue import CatalogueEntry


def owned_count(slot_map: SlotMap, shard_index: int, extra: np.ndarray | None = None) -> int:
    """Slots the shard owns in ``slot_map``, plus those of ``extra`` (a NUM_SLOTS mask)."""
    owned = slot_map.owner_table() == shard_index
    return int((owned | extra).sum()) if extra is not None else int(owned.sum())


def rows_to_host(entry: CatalogueEntry, shard_index: int) -> int:
    """The least rows a node creates ``entry``'s table with: what it grew to, and what
    the slots it owns need (e.g. a checkpoint taken after a move, loaded again)."""
    owned = owned_count(entry.slot_map, shard_index)
    return max(entry.reserved_rows, rows_for_slots(entry.spec, owned))
