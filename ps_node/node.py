"""The data path of one node: pulls, pushes and updates, and the WAL hook.

Every method is blocking and thread-safe; the servicer runs them on a thread
pool so the event loop never waits on the engine or the disk. A table's lock
orders its writes, so the write-ahead log replays them in the order they were
applied. In WAL mode a write is applied only once its record is in the log
(``write_logged``); the node's ``WriteGate`` refuses every write after the log
failed. The tables themselves are hosted by ``recstore.ps.tables``, each
one's state is a ``recstore.ps.hosted_table.HostedTable``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from recstore.core import InvalidArgument, slots_touched
from recstore.core.request_id import Named
from recstore.core.wire import Buffer
from recstore.ps import codec
from recstore.ps.hosted_table import HostedTable, check_owned
from recstore.ps.tables import NodeTables
from recstore.ps.wal.dedup import Entry
from recstore.ps.wal.records import (
    KEYS_ONLY,
    OP_PUSH,
    OP_STEP,
    OP_UPDATE,
    encode_record,
    encode_window_record,
)
from recstore.ps.wal.table_log import Appended, TableWal


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


def check_lr(lr: float | None) -> float | None:
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        raise InvalidArgument(f"lr must be a positive finite number, got {lr}")
    return lr


class Node(NodeTables):
    """One node's tables (``NodeTables``) and their data path."""

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
        with self.reshards.admitted(name, keys, hosted.entry.slot_map.epoch):
            check_owned(hosted, keys)
            # No table lock: the engine's reader-writer lock suffices, and rows a pull
            # inserts come from the deterministic initializer, so neither the log nor
            # a concurrent checkpoint needs to order them.
            pull_into(hosted, keys, values_out, found_out, value_dtype or hosted.dtype)
            if found_out is None:
                self.reshards.record(name, keys)  # any of them may be a new row
                hosted.note_pulled(keys)
        return len(keys)

    def push(
        self, name: str, keys_buffer: Buffer, values_buffer: Buffer, dtype: str, dim: int
    ) -> WriteAck:
        hosted = self.get(name)
        codec.check_declared(dtype, dim, hosted.dtype, hosted.dim)
        keys = codec.decode_keys(keys_buffer)
        values = codec.decode_rows(values_buffer, len(keys), hosted.dim, hosted.dtype)
        with self.reshards.admitted(name, keys, hosted.entry.slot_map.epoch):
            check_owned(hosted, keys)
            write = Write(
                hosted, OP_PUSH, keys_buffer, values_buffer, hosted.dtype, None,
                functools.partial(hosted.table.push, keys, values),
            )  # fmt: skip
            with hosted.lock:
                (ack,) = self.write_logged([write])
            self.reshards.record(name, keys)
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
        with self.reshards.admitted(name, keys, hosted.entry.slot_map.epoch):
            if named is None:
                check_owned(hosted, keys)
                write = Write(hosted, OP_UPDATE, keys_buffer, grads_buffer, grad_dtype, lr, apply)
                with hosted.lock:
                    (ack,) = self.write_logged([write])
                self.reshards.record(name, keys)
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
            self.reshards.record(name, keys)
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
