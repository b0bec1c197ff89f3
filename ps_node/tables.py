"""The tables one node hosts: create, drop, look up, and those it refuses to serve.

``NodeTables`` holds the store, the hosted tables and the catalogue under the
registry lock; ``Node`` (``recstore.ps.node``) adds the data path on top.
Persistence (save, load) lives in ``recstore.ps.checkpoint.persistence``, crash recovery
in ``recstore.ps.checkpoint.recovery``; a table recovery could not restore is kept as
refused (catalogued, never served, never silently recreated empty): its data
calls raise ``TableUnrecoverable``.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from recstore.core import (
    InvalidArgument,
    SlotMap,
    TableExists,
    TableNotFound,
    TableSpec,
)
from recstore.core.errors import TableUnrecoverable
from recstore.core.proto_convert import TableCondition
from recstore.ps import catalogue
from recstore.ps.cache_reports import CacheReports
from recstore.ps.capacity import rows_to_host
from recstore.ps.catalogue import CatalogueEntry
from recstore.ps.changes import ChangeTracker
from recstore.ps.hosted_table import HostedTable, owned_slots
from recstore.ps.reshard.slots import Reshards
from recstore.ps.wal.dedup import DedupWindow, capacity_from_env
from recstore.ps.wal.records import encode_window_record
from recstore.ps.wal.segment_file import SegmentFile, SegmentOpener
from recstore.ps.wal.table_log import TableWal
from recstore.ps.wal.write_gate import WriteGate
from recstore.store import Store


@dataclass(frozen=True)
class Refusal:
    """Why a catalogued table is not served; ``condition`` is its ``Recovered=False``."""

    entry: CatalogueEntry
    condition: TableCondition

    @property
    def error(self) -> TableUnrecoverable:
        return TableUnrecoverable(self.condition.message)


class NodeTables:
    """The hosted and refused tables of one node, and the catalogue listing them."""

    def __init__(
        self,
        data_dir: Path,
        *,
        shard_index: int = 0,
        num_shards: int = 1,
        device: str = "cpu",
        wal_enabled: bool = False,
        wal_files: SegmentOpener = SegmentFile,
    ) -> None:
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard index {shard_index} is not in 0..{num_shards - 1}")
        self.data_dir = data_dir
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.device = device
        self.wal_enabled = wal_enabled
        #: request ids each table's de-dup window holds
        self.dedup_capacity = capacity_from_env()
        #: how log segments are opened: the seam where tests inject a failing disk
        self.wal_files = wal_files
        #: shut by the first log failure: no write is accepted until the log works again
        self.write_gate = WriteGate()
        self.store = Store()
        self.tables: dict[str, HostedTable] = {}
        #: catalogued tables recovery could not restore; their data calls are refused
        self.refused: dict[str, Refusal] = {}
        #: conditions of hosted tables (e.g. restored from an older checkpoint)
        self.conditions: dict[str, list[TableCondition]] = {}
        #: guards the set of tables and the catalogue (create, drop, save, load)
        self.registry_lock = threading.RLock()
        #: slots moving out (tracked, sealable) and in (importing) per table
        self.reshards = Reshards()
        #: the host caches trainers hold in front of each table (CacheReport)
        self.cache_reports = CacheReports()

    # -- tables ---------------------------------------------------------------
    def wal_dir(self, entry: CatalogueEntry) -> Path:
        return self.data_dir / "wal" / f"{entry.spec.name}-{entry.incarnation}"

    def open_wal(
        self, hosted: HostedTable, *, first_generation: int = 0,
        predecessor_end: int | None = None,
    ) -> TableWal:  # fmt: skip
        """A table's log on a fresh segment, sharing the node's write gate; every
        segment opens with the table's de-dup window (``TableWal`` says what
        ``first_generation`` and ``predecessor_end`` are)."""
        entry, window = hosted.entry, hosted.window
        return TableWal(
            self.wal_dir(entry), table=entry.spec.name, gate=self.write_gate,
            files=self.wal_files, opening=lambda: encode_window_record(window.entries()),
            first_generation=first_generation, predecessor_end=predecessor_end,
        )  # fmt: skip

    def host(self, entry: CatalogueEntry) -> HostedTable:
        """Create the engine table for ``entry`` and register it (no catalogue write)."""
        return self.serve(self.prepare(entry))

    def prepare(self, entry: CatalogueEntry) -> HostedTable:
        """Create the engine table for ``entry``, not served yet (``serve``, or ``discard``):
        a table being recovered is never seen half restored."""
        table = self.store.create(
            entry.spec, shard_index=self.shard_index, num_shards=self.num_shards,
            device=self.device, min_rows=rows_to_host(entry, self.shard_index),
        )  # fmt: skip
        return HostedTable(
            table=table,
            entry=entry,
            owned_slots=owned_slots(entry.slot_map, self.shard_index),
            lock=threading.Lock(),
            wal=None,
            window=DedupWindow(self.dedup_capacity),
            changes=ChangeTracker.of_every_slot() if entry.spec.checkpoint.full_every > 1 else None,
        )

    def serve(self, hosted: HostedTable) -> HostedTable:
        """Register a prepared table: its calls are served from now on."""
        self.tables[hosted.entry.spec.name] = hosted
        self.refused.pop(hosted.entry.spec.name, None)  # e.g. an explicit Load repaired it
        return hosted

    def discard(self, hosted: HostedTable) -> None:
        """Drop a prepared table that is not to be served."""
        if hosted.wal is not None:
            hosted.wal.close()
        self.store.drop(hosted.entry.spec.name)

    def unhost(self, name: str) -> None:
        hosted = self.tables.pop(name)
        self.conditions.pop(name, None)
        self.cache_reports.forget(name)
        if hosted.wal is not None:
            hosted.wal.close()
        self.store.drop(name)

    def save_catalogue(self, pending: dict[str, CatalogueEntry] | None = None) -> None:
        """Write the catalogue durably; ``pending``: entries about to replace those hosted."""
        entries = {n: r.entry for n, r in self.refused.items()}
        hosted = {n: h.entry for n, h in self.tables.items()}
        catalogue.save(self.data_dir, entries | hosted | (pending or {}))

    def create_table(self, spec: TableSpec, slot_map: SlotMap | None) -> tuple[HostedTable, bool]:
        with self.registry_lock:
            self.check_servable((spec.name,))  # a refused table is never recreated empty
            existing = self.tables.get(spec.name)
            if existing is not None:  # e.g. a client joining a table whose shards moved
                if existing.entry.spec != spec:
                    raise TableExists(f"table {spec.name!r} exists with a different spec")
                return existing, False
            if slot_map is None:
                if spec.shards != self.num_shards:
                    raise InvalidArgument(
                        f"table {spec.name!r} has {spec.shards} shards but this node is shard "
                        f"{self.shard_index} of {self.num_shards}; pass a slot map or match them"
                    )
                slot_map = SlotMap.initial(self.num_shards)
            entry = CatalogueEntry(spec, slot_map, uuid.uuid4().hex[:12])
            hosted = self.host(entry)
            try:
                if self.wal_enabled:
                    hosted.wal = self.open_wal(hosted)
                self.save_catalogue()
            except BaseException:
                self.unhost(spec.name)
                raise
            return hosted, True

    def drop_table(self, name: str) -> None:
        with self.registry_lock:
            refusal = self.refused.pop(name, None)
            if refusal is not None:  # the operator gives up on its data
                self.save_catalogue()
                shutil.rmtree(self.wal_dir(refusal.entry), ignore_errors=True)
                return
            hosted = self.get(name)
            with hosted.lock:
                self.unhost(name)
            self.save_catalogue()
            if hosted.wal is not None:
                for segment in hosted.wal.directory.glob("*"):
                    segment.unlink()
                hosted.wal.directory.rmdir()

    def get(self, name: str) -> HostedTable:
        hosted = self.tables.get(name)
        if hosted is None:
            self.check_servable((name,))
            raise TableNotFound(f"table {name!r} is not hosted on this node")
        return hosted

    def check_servable(self, names: Iterable[str]) -> None:
        """Refuse a request naming a table recovery could not restore."""
        for name in names:
            refusal = self.refused.get(name)
            if refusal is not None:
                raise refusal.error
