"""What a node keeps for each table it hosts, and which of its keys the node owns.

``HostedTable`` holds the engine table with its catalogue entry, lock, log,
de-dup window, version and changes since the last checkpoint; what the data
path derives from the spec is computed once. ``check_owned`` is the routing
check of every data request: a key of a slot this node does not own refuses
the whole request with ``WrongShard``, which carries the node's slot-map epoch.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recstore import _native as _native_module
from recstore.core import DType, Eviction, KeyMode, SlotMap, WrongShard, slot_of, slots_touched
from recstore.ps.catalogue import CatalogueEntry
from recstore.ps.changes import ChangeTracker
from recstore.ps.wal.dedup import DedupWindow
from recstore.ps.wal.table_log import TableWal
from recstore.store import Table

#: the compiled engine (no type stubs)
_native: Any = _native_module

#: One increasing sequence for the versions of every table this process hosts, started
#: at the clock: a table reloaded, or hosted again after a restart, never reports a
#: version it reported before, so a client cache cannot mistake old rows for current.
_VERSIONS = itertools.count(time.time_ns())


def next_version() -> int:
    return next(_VERSIONS)


@dataclass
class ChainTip:
    """What a table's newest checkpoint leaves for the next one to build on
    (``recstore.ps.checkpoint.incremental``)."""

    links: list[dict[str, str]]  # that checkpoint's chain, itself included, full one first
    keys: np.ndarray  # sorted keys of the rows it holds (its chain replayed)


@dataclass
class HostedTable:
    table: Table
    entry: CatalogueEntry
    owned_slots: np.ndarray | None  # bool per slot; None when the node owns every slot
    lock: threading.Lock
    wal: TableWal | None
    #: request ids of the updates applied lately (recstore.ps.wal.dedup)
    window: DedupWindow = field(default_factory=DedupWindow)
    #: moves after every write is applied (never before: a pull reads it before its rows,
    #: so rows read with a version are at least that new); PullResponse/TableStats.version.
    #: Shared with the server's fast path, which reads it for the pulls it serves.
    version_cell: Any = field(default_factory=lambda: _native.VersionCell(next_version()))
    #: keys changed since the last checkpoint (tables saved incrementally only)
    changes: ChangeTracker | None = None
    #: what the table's newest checkpoint left for an increment to build on
    chain: ChainTip | None = None

    @property
    def version(self) -> int:
        return int(self.version_cell.value)

    def wrote(self) -> None:
        """A write to this table was applied: rows read earlier may be stale."""
        self.version_cell.value = next_version()

    # The entry never changes while a table is hosted (a reload hosts a new
    # HostedTable), so what the data path derives from its spec is computed once.
    @functools.cached_property
    def dtype(self) -> str:
        return DType(self.entry.spec.dtype).value

    @property
    def dim(self) -> int:
        return self.entry.spec.embedding_dim

    @functools.cached_property
    def id_limit(self) -> int | None:
        """num_embeddings of a dense table (ids must lie below it); None when hashed."""
        spec = self.entry.spec
        return spec.num_embeddings if spec.key_mode == KeyMode.dense else None

    @functools.cached_property
    def evicts(self) -> bool:
        """Whether the table makes room by evicting rows (else inserts can fill it)."""
        return self.entry.spec.keys.eviction != Eviction.none

    def note_pulled(self, keys: np.ndarray) -> None:
        """Record what a pull touched where it matters to an increment: in a table that
        drops rows on its own, a pull may bring back a row the last checkpoint held
        with other values (elsewhere a row a pull inserts is found as a new key)."""
        if self.changes is not None and self.drops_rows:
            self.changes.record(keys)

    @functools.cached_property
    def drops_rows(self) -> bool:
        return self.evicts or self.entry.spec.keys.ttl_seconds is not None


@functools.lru_cache(maxsize=64)
def owned_slots(slot_map: SlotMap, shard_index: int) -> np.ndarray | None:
    """Read-only and shared by the tables of one slot map, so a multi-table request
    whose tables share a map checks all its keys against one array."""
    owned = slot_map.owner_table() == shard_index
    if owned.all():
        return None
    owned.flags.writeable = False
    return owned


def check_owned(hosted: HostedTable, keys: np.ndarray, touched: np.ndarray | None = None) -> None:
    """Refuse the whole request when any key belongs to another shard (``touched``: the
    keys' ``slots_touched``, when the caller has them already)."""
    owned = hosted.owned_slots
    if owned is None or len(keys) == 0:
        return
    if owned[slots_touched(keys) if touched is None else touched].all():
        return
    foreign = ~owned[slot_of(keys)]  # counted for the refusal only
    if foreign.any():
        epoch = hosted.entry.slot_map.epoch
        raise WrongShard(
            f"{int(foreign.sum())} of {len(keys)} keys belong to slots this node does not own "
            f"(table {hosted.entry.spec.name!r}, slot-map epoch {epoch})",
            epoch,
        )
