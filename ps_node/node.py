"""The tables of one node: the store, per-table locks, routing checks, the WAL hook.

Every method is blocking and thread-safe; the servicer runs them on a thread
pool so the event loop never waits on the engine or the disk. A table's lock
orders its writes, so the write-ahead log replays them in the order they were
applied. In WAL mode a write is applied only once its record is in the log
(``write_logged``); the node's ``WriteGate`` refuses every write after the log
failed. Persistence (save, load) lives in ``recstore.ps.persistence``, crash
recovery in ``recstore.ps.recovery``; a table recovery could not restore is
kept as refused (catalogued, never served, never silently recreated empty).
"""

from __future__ import annotations

import functools
import itertools
import math
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from recstore.core import (
    DType,
    Eviction,
    InvalidArgument,
    KeyMode,
    RecStoreError,
    SlotMap,
    TableExists,
    TableNotFound,
    TableSpec,
    WrongShard,
    slot_of,
    slots_touched,
)
from recstore.core.proto_convert import TableCondition
from recstore.core.request_id import Named
from recstore.core.wire import Buffer
from recstore.ps import catalogue, codec
from recstore.ps.cache_reports import CacheReports
from recstore.ps.capacity import rows_to_host
from recstore.ps.catalogue import CatalogueEntry
from recstore.ps.changes import ChangeTracker
from recstore.ps.dedup import DedupWindow, Entry, capacity_from_env
from recstore.ps.migration import Migrations
from recstore.ps.table_wal import Appended, TableWal
from recstore.ps.wal import (
    KEYS_ONLY,
    OP_PUSH,
    OP_STEP,
    OP_UPDATE,
    encode_record,
    encode_window_record,
)
from recstore.ps.wal_io import SegmentFile, SegmentOpener
from recstore.ps.write_gate import WriteGate
from recstore.store import Store, Table

if TYPE_CHECKING:
    from recstore.ps.incremental import ChainTip

#: One increasing sequence for the versions of every table this process hosts, started
#: at the clock: a table reloaded, or hosted again after a restart, never reports a
#: version it reported before, so a client cache cannot mistake old rows for current.
_VERSIONS = itertools.count(time.time_ns())


def next_version() -> int:
    return next(_VERSIONS)


@dataclass
class HostedTable:
    table: Table
    entry: CatalogueEntry
    owned_slots: np.ndarray | None  # bool per slot; None when the node owns every slot
    lock: threading.Lock
    wal: TableWal | None
    #: request ids of the updates applied lately (recstore.ps.dedup)
    window: DedupWindow = field(default_factory=DedupWindow)
    #: moves after every write is applied (never before: a pull reads it before its rows,
    #: so rows read with a version are at least that new); PullResponse/TableStats.version
    version: int = field(default_factory=next_version)
    #: keys changed since the last checkpoint (tables saved incrementally only)
    changes: ChangeTracker | None = None
    #: what the table's newest checkpoint left for an increment to build on
    chain: ChainTip | None = None

    def wrote(self) -> None:
        """A write to this table was applied: rows read earlier may be stale."""
        self.version = next_version()

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


class TableUnrecoverable(RecStoreError):
    """A table whose saved state could not be restored: refused (gRPC FAILED_PRECONDITION)."""


@dataclass(frozen=True)
class Refusal:
    """Why a catalogued table is not served; ``condition`` is its ``Recovered=False``."""

    entry: CatalogueEntry
    condition: TableCondition

    @property
    def error(self) -> TableUnrecoverable:
        return TableUnrecoverable(self.condition.message)


@dataclass(frozen=True)
class WriteAck:
    """What a writer awaits before replying: record ``seq`` of ``wal`` (if any) durable."""

    rows: int
    wal: TableWal | None = None
    seq: int = 0


@dataclass(frozen=True)
class Write:
    """One table's write: its log record's fields, and how to apply it in memory."""

    hosted: HostedTable
    op: int
    keys: Buffer
    values: Buffer  # values of a push, grads of an update
    dtype: str
    lr: float | None
    apply: Callable[[], None]
    state: Buffer = b""  # optimizer state of an import (OP_IMPORT)
    request: Entry | None = None  # the named request it belongs to, logged with it


def recorded_ack(hosted: HostedTable, known: Entry) -> WriteAck:
    """The acknowledgement of a request applied already: its rows, once its record is durable."""
    wal = hosted.wal if known.log_seq else None
    return WriteAck(sum(known.rows), wal, known.log_seq)


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


def check_lr(lr: float | None) -> float | None:
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        raise InvalidArgument(f"lr must be a positive finite number, got {lr}")
    return lr


class Node:
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
        self.migrations = Migrations()
        #: the host caches trainers hold in front of each table (CacheReport)
        self.cache_reports = CacheReports()

    # -- tables ---------------------------------------------------------------
    def wal_dir(self, entry: CatalogueEntry) -> Path:
        return self.data_dir / "wal" / f"{entry.spec.name}-{entry.incarnation}"

    def open_wal(self, entry: CatalogueEntry) -> TableWal:
        """A table's log on a fresh segment, sharing the node's write gate; every
        segment opens with the hosted table's de-dup window."""
        window = self.tables[entry.spec.name].window
        return TableWal(
            self.wal_dir(entry), table=entry.spec.name, gate=self.write_gate,
            files=self.wal_files, opening=lambda: encode_window_record(window.entries()),
        )  # fmt: skip

    def host(self, entry: CatalogueEntry) -> HostedTable:
        """Create the engine table for ``entry`` and register it (no catalogue write)."""
        table = self.store.create(
            entry.spec, shard_index=self.shard_index, num_shards=self.num_shards,
            device=self.device, min_rows=rows_to_host(entry, self.shard_index),
        )  # fmt: skip
        hosted = HostedTable(
            table=table,
            entry=entry,
            owned_slots=owned_slots(entry.slot_map, self.shard_index),
            lock=threading.Lock(),
            wal=None,
            window=DedupWindow(self.dedup_capacity),
            changes=ChangeTracker.of_every_slot() if entry.spec.checkpoint.full_every > 1 else None,
        )
        self.tables[entry.spec.name] = hosted
        self.refused.pop(entry.spec.name, None)  # e.g. an explicit Load repaired it
        return hosted

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
                    hosted.wal = self.open_wal(entry)
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

    # -- data path --------------------------------------------------------------
    def pull(
        self,
        name: str,
        keys_buffer: Buffer,
        values_out: np.ndarray,
        found_out: np.ndarray | None = None,
        value_dtype: str = "",
    ) -> int:
        """Gather rows into ``values_out`` (the reply's payload); read-only when ``found_out``.

        ``value_dtype``: what ``values_out`` holds (empty: the table dtype; a float32
        table's rows converted, codec.value_dtype_for). Returns the number of rows.
        """
        hosted = self.get(name)
        keys = codec.decode_keys(keys_buffer)
        with self.migrations.admitted(name, keys, hosted.entry.slot_map.epoch):
            check_owned(hosted, keys)
            # No table lock: the engine's reader-writer lock suffices, and rows a pull
            # inserts come from the deterministic initializer, so neither the log nor
            # a concurrent checkpoint needs to order them.
            pull_into(hosted, keys, values_out, found_out, value_dtype or hosted.dtype)
            if found_out is None:
                self.migrations.record(name, keys)  # any of them may be a new row
                hosted.note_pulled(keys)
        return len(keys)

    def push(
        self, name: str, keys_buffer: Buffer, values_buffer: Buffer, dtype: str, dim: int
    ) -> WriteAck:
        hosted = self.get(name)
        codec.check_declared(dtype, dim, hosted.dtype, hosted.dim)
        keys = codec.decode_keys(keys_buffer)
        values = codec.decode_rows(values_buffer, len(keys), hosted.dim, hosted.dtype)
        with self.migrations.admitted(name, keys, hosted.entry.slot_map.epoch):
            check_owned(hosted, keys)
            write = Write(
                hosted, OP_PUSH, keys_buffer, values_buffer, hosted.dtype, None,
                functools.partial(hosted.table.push, keys, values),
            )  # fmt: skip
            with hosted.lock:
                (ack,) = self.write_logged([write])
            self.migrations.record(name, keys)
            return ack

    def update(
        self,
        name: str,
        keys_buffer: Buffer,
        grads_buffer: Buffer,
        grad_dtype: str,
        dim: int,
        lr: float | None,
        named: Named | None = None,
    ) -> WriteAck:
        """Apply gradients; a ``named`` request applied already is answered, not applied."""
        hosted = self.get(name)
        hosted.entry.spec.check_trainable()
        codec.check_declared("", dim, hosted.dtype, hosted.dim)
        grad_dtype = codec.grad_dtype_for(grad_dtype, hosted.dtype)
        keys = codec.decode_keys(keys_buffer)
        grads = codec.decode_rows(grads_buffer, len(keys), hosted.dim, grad_dtype, "grads")
        check_lr(lr)
        apply = functools.partial(hosted.table.update, keys, grads, lr)
        with self.migrations.admitted(name, keys, hosted.entry.slot_map.epoch):
            if named is None:
                check_owned(hosted, keys)
                write = Write(hosted, OP_UPDATE, keys_buffer, grads_buffer, grad_dtype, lr, apply)
                with hosted.lock:
                    (ack,) = self.write_logged([write])
                self.migrations.record(name, keys)
                return ack
            # Looked up before the owner check: a resend of an update applied here before
            # its slots moved away is answered from this window.
            known = hosted.window.begin(named.request_id, named.digest)
            if known is not None:
                return recorded_ack(hosted, known)
            try:
                slots = slots_touched(keys)
                check_owned(hosted, keys, slots)
                rid, digest, rows = named.request_id, named.digest, (len(keys),)
                logged = Entry(rid, digest, rows, slots)
                write = Write(
                    hosted, OP_UPDATE, keys_buffer, grads_buffer, grad_dtype, lr, apply,
                    request=logged,
                )  # fmt: skip
                with hosted.lock:
                    (ack,) = self.write_logged([write])
            except BaseException:
                hosted.window.abandon(named.request_id)
                raise
            hosted.window.finish(Entry(rid, digest, rows, slots, ack.seq))
            self.migrations.record(name, keys)
            return ack

    def absorb_window(self, name: str, entries: Sequence[Entry]) -> None:
        """Take de-dup entries of slots moving here (online resharding: the source's
        ``window.entries_touching``); in WAL mode they are logged, durably, first."""
        hosted = self.get(name)
        with hosted.lock:
            appended = None
            if hosted.wal is not None:
                appended = hosted.wal.append(encode_window_record(list(entries)))
            hosted.window.absorb(entries)
        if appended is not None and hosted.wal is not None:
            hosted.wal.wait_durable(appended.seq)

    def write_logged(self, writes: Sequence[Write]) -> list[WriteAck]:
        """Log every write, then apply them in order (callers hold the tables' locks).

        All records are appended before any write is applied: when one cannot be
        appended (``WritesStopped``) the ones already appended are cut back out and
        nothing is applied. A write the engine refuses has its record, and those of
        the writes after it, cut back out; the writes before it stay applied and logged.
        """
        appended: list[Appended | None] = []
        try:
            for write in writes:
                appended.append(self._append(write))
        except BaseException:
            self._retract(writes, appended)
            raise
        for done, write in enumerate(writes):
            try:
                write.apply()
            except BaseException:
                self._retract(writes[done:], appended[done:])
                raise
            write.hosted.wrote()
            changes = write.hosted.changes
            if changes is not None and write.op != OP_STEP:  # the step is saved in every link
                changes.record(codec.decode_keys(write.keys))
        return [
            WriteAck(len(w.keys) // codec.KEY_DTYPE.itemsize, w.hosted.wal, a.seq if a else 0)
            for w, a in zip(writes, appended, strict=True)
        ]

    def _append(self, write: Write) -> Appended | None:
        wal = write.hosted.wal
        if wal is None:
            return None
        rows = len(write.keys) // codec.KEY_DTYPE.itemsize
        dim = 0 if write.op in KEYS_ONLY else write.hosted.dim
        return wal.append(
            encode_record(
                write.op,
                write.keys,
                write.values,
                write.dtype,
                rows,
                dim,
                write.lr,
                write.state,
                write.request,
                epoch=write.hosted.entry.slot_map.epoch,  # callers hold the table's lock
            )
        )

    @staticmethod
    def _retract(writes: Sequence[Write], appended: Sequence[Appended | None]) -> None:
        """Cut the records of writes that were not applied back out, last first."""
        for write, record in reversed(list(zip(writes, appended, strict=False))):
            if record is not None and write.hosted.wal is not None:
                write.hosted.wal.retract(record)


def pull_into(
    hosted: HostedTable,
    keys: np.ndarray,
    values_out: np.ndarray,
    found_out: np.ndarray | None,
    value_dtype: str,
) -> None:
    """A pull's rows into ``values_out`` as ``value_dtype`` (read-only when ``found_out``)."""
    rows = values_out
    if value_dtype != hosted.dtype:  # a float32 table's rows travelling in 16 bits
        rows = np.empty(values_out.shape, codec.WIRE_DTYPES[hosted.dtype])
    if found_out is None:
        hosted.table.pull(keys, out=rows)
    else:
        _, found = hosted.table.find(keys, out=rows)
        found_out[:] = found
    if rows is not values_out:
        codec.convert_rows(rows, hosted.dtype, values_out, value_dtype)
