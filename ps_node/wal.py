"""Write-ahead log of one table: every acknowledged Push/Update survives kill -9.

A log is a directory of segments ``<generation>.wal``; each segment starts with
a magic and holds length-prefixed records with a CRC32. A writer appends its
record under the table lock (so the log order is the apply order) and only
then applies the write; it replies once a background flusher has fsynced
everything written so far with one fsync (group commit). A checkpoint rotates
to a new segment and records its generation; segments are deleted only below
the generation of the oldest checkpoint kept (``recstore.ps.persistence``), so
a damaged newer checkpoint can be passed over and an older one brought forward
by the log. Replay stops a segment at the first torn or corrupt record: it was
never acknowledged.

A write record also says under which slot-map epoch the node applied it
(``FLAG_EPOCH``: the epoch follows the head), so a table's logs tell which node
wrote which slots at which epoch (``recstore.ps.apply_log``). Records of logs
written before that have the flag clear and replay as before.

Fail-stop: a record that cannot be written is cut back out and refused
(nothing applied); an fsync that fails cuts the segment back to what was
durable and fails every writer waiting (their writes are applied, not
durable). Either way the log shuts the node's ``WriteGate`` and abandons its
segment; ``reopen`` continues on a fresh one once the disk works again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recstore.core import WriteNotDurable, WritesStopped
from recstore.core.wire import Buffer
from recstore.ps.codec import KEY_DTYPE, WIRE_DTYPES
from recstore.ps.dedup import Entry
from recstore.ps.dedup_log import FLAG_REQUEST, decode_entries, encode_entries, encode_entry
from recstore.ps.wal_io import SegmentFile, SegmentOpener
from recstore.ps.write_gate import LogFault, WriteGate, refusal

log = logging.getLogger(__name__)

MAGIC = b"RSWAL001"
FRAME = struct.Struct("<II")  # payload length, crc32(payload)
HEAD = struct.Struct("<BBHIIf")  # op, dtype code, flags, rows, dim, lr (NaN: none)
OP_PUSH = 1
OP_UPDATE = 2
OP_IMPORT = 3  # rows with their optimizer state (ImportRows): float32 state after the values
OP_STEP = 4  # the table's optimizer step count set (ImportRows): one key holds it, no values
OP_WINDOW = 5  # the table's de-dup window (recstore.ps.dedup_log); rows: its entry count
FLAG_EPOCH = 2  # the head is followed by the slot-map epoch the write was applied under
EPOCH = struct.Struct("<Q")
OP_ERASE = 6  # rows removed (a move's cleanup, an aborted or trimmed import): keys, no values
#: records holding keys alone (no value rows)
KEYS_ONLY = frozenset({OP_STEP, OP_ERASE})
DTYPE_CODES = {name: code for code, name in enumerate(WIRE_DTYPES)}
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}
Waiter = tuple[int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]


@dataclass(frozen=True)
class Appended:
    """Where one appended record went: its sequence number and bytes in its segment."""

    seq: int
    generation: int
    start: int
    end: int


@dataclass(frozen=True)
class WalRecord:
    op: int
    keys: np.ndarray  # int64[rows]
    values: np.ndarray  # [rows, dim] of dtype (values for push, grads for update)
    dtype: str
    lr: float | None
    state: np.ndarray | None = None  # float32[rows, width] of an import
    request: Entry | None = None  # the request it belongs to (slots not filled in)
    window: tuple[Entry, ...] = ()  # an OP_WINDOW record's entries
    epoch: int | None = None  # the slot-map epoch it was applied under (None: not logged)


def encode_record(
    op: int,
    keys: Buffer,
    values: Buffer,
    dtype: str,
    rows: int,
    dim: int,
    lr: float | None,
    state: Buffer = b"",
    request: Entry | None = None,
    epoch: int | None = None,
) -> bytes:
    """One framed record; ``keys``/``values``/``state`` are the request's raw buffers.

    ``epoch`` (the slot map's the write is applied under) follows the head; an
    import's state follows its values; a named write's request ends the record
    (imports are never named, so the two never meet)."""
    assert not (state and request), "an import record names no request"
    flags = (0 if request is None else FLAG_REQUEST) | (0 if epoch is None else FLAG_EPOCH)
    head = HEAD.pack(op, DTYPE_CODES[dtype], flags, rows, dim, math.nan if lr is None else lr)
    applied_under = b"" if epoch is None else EPOCH.pack(epoch)
    trailer = b"" if request is None else encode_entry(request, with_slots=False)
    return _framed(b"".join((head, applied_under, keys, values, state, trailer)))


def encode_window_record(entries: list[Entry]) -> bytes:
    """The record a segment opens with: the table's de-dup window."""
    count, body = encode_entries(entries)
    return _framed(HEAD.pack(OP_WINDOW, 0, 0, count, 0, math.nan) + body)


def _framed(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def decode_payload(payload: bytes) -> WalRecord:
    op, code, flags, rows, dim, lr = HEAD.unpack_from(payload)
    dtype = DTYPE_NAMES[code]
    if op == OP_WINDOW:
        window = tuple(decode_entries(payload, HEAD.size, rows))
        return WalRecord(op, np.empty(0, KEY_DTYPE), np.empty((0, 0)), dtype, None, window=window)
    epoch = EPOCH.unpack_from(payload, HEAD.size)[0] if flags & FLAG_EPOCH else None
    keys_start = HEAD.size + (EPOCH.size if epoch is not None else 0)
    keys_end = keys_start + rows * KEY_DTYPE.itemsize
    keys = np.frombuffer(payload, KEY_DTYPE, rows, keys_start)
    values = np.frombuffer(payload, WIRE_DTYPES[dtype], rows * dim, keys_end).reshape(rows, dim)
    values_end = keys_end + values.nbytes
    state = request = None
    if op == OP_IMPORT:  # what follows the values is the rows' optimizer state
        width = (len(payload) - values_end) // (4 * rows) if rows else 0
        state = np.frombuffer(payload, np.float32, rows * width, values_end).reshape(rows, width)
    elif flags & FLAG_REQUEST:
        (request,) = decode_entries(payload, values_end, 1)
    lr_or_none = None if math.isnan(lr) else float(lr)
    return WalRecord(op, keys, values, dtype, lr_or_none, state, request, epoch=epoch)


def iter_records(data: bytes) -> Iterator[WalRecord]:
    """Records of one segment's bytes, stopping at a torn or corrupt record."""
    if not data.startswith(MAGIC):
        return
    offset = len(MAGIC)
    while offset + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, offset)
        start, end = offset + FRAME.size, offset + FRAME.size + length
        if end > len(data) or length < HEAD.size:
            log.warning("wal: torn record at offset %d ignored", offset)
            return
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            log.warning("wal: checksum mismatch at offset %d; rest of segment ignored", offset)
            return
        yield decode_payload(payload)
        offset = end


def segment_path(directory: Path, generation: int) -> Path:
    return directory / f"{generation:012d}.wal"


def generations(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.wal") if p.stem.isdigit())


def reaches_back(directory: Path, generation: int) -> bool:
    """Whether every segment from ``generation`` to the newest is there, so that a
    replay from ``generation`` brings back every write logged since."""
    present = [g for g in generations(directory) if g >= generation]
    return bool(present) and present == list(range(generation, present[-1] + 1))


def replay(
    directory: Path,
    start_generation: int,
    apply: Callable[[WalRecord], None],
    window: Callable[[tuple[Entry, ...]], None] | None = None,
) -> int:
    """Apply every write record of segments >= ``start_generation`` in order; returns
    their count. Window records go to ``window`` (skipped without one)."""
    count = 0
    for generation in generations(directory):
        if generation < start_generation:
            continue
        for record in iter_records(segment_path(directory, generation).read_bytes()):
            if record.op == OP_WINDOW:
                if window is not None:
                    window(record.window)
                continue
            apply(record)
            count += 1
    return count


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TableWal:
    """The open log of one table: append before apply, group commit, rotate, fail-stop."""

    def __init__(
        self,
        directory: Path,
        *,
        table: str = "",
        gate: WriteGate | None = None,
        files: SegmentOpener = SegmentFile,
        opening: Callable[[], bytes] | None = None,
    ) -> None:
        self.directory = directory
        #: the record every fresh segment starts with (the table's de-dup window)
        self._opening = opening
        self.table = table or directory.name
        self.gate = gate if gate is not None else WriteGate()
        self._files = files
        directory.mkdir(parents=True, exist_ok=True)
        # Lock order: _write_lock, then _cond. The writer's lock covers every change
        # to the open segment (append, cut, rotate, reopen); _cond the flusher's
        # bookkeeping and the writers waiting on it.
        self._write_lock = threading.Lock()
        self._cond = threading.Condition()
        self._appended = 0  # sequence number of the last record written to the segment
        self._settled = 0  # ... of the last one fsynced or lost
        self._written_size = 0  # segment bytes once every appended record is in
        self._durable_size = 0  # segment bytes known to be on disk
        self._lost: list[tuple[int, int]] = []  # (first, last) applied, never durable
        self._syncing = False
        self._failed: LogFault | None = None
        self._refused_size = 0  # bytes of the record whose write failed
        self._waiters: list[Waiter] = []
        self._closed = False
        existing = generations(directory)
        self.generation = (existing[-1] + 1) if existing else 0
        self._file: SegmentFile | None = self._open_segment(self.generation)
        self._flusher = threading.Thread(target=self._flush_loop, name="wal-flush", daemon=True)
        self._flusher.start()

    @property
    def fault(self) -> LogFault | None:
        """Why this log stopped (it abandoned its segment), None while it works."""
        return self._failed

    def _open_segment(self, generation: int) -> SegmentFile:
        """A fresh segment holding the magic, fsynced with its directory entry."""
        path = segment_path(self.directory, generation)
        handle = self._files(path)
        try:
            handle.write(MAGIC + (self._opening() if self._opening is not None else b""))
            handle.sync()
            fsync_dir(self.directory)
        except BaseException:
            with contextlib.suppress(OSError):
                handle.close()
                path.unlink(missing_ok=True)
            raise
        with self._cond:
            self._written_size = self._durable_size = handle.size
        return handle

    def append(self, record: bytes) -> Appended:
        """Write a framed record before its write is applied (see ``durable``).

        Raises ``WritesStopped`` when the record is not in the log: the caller
        applies nothing.
        """
        with self._write_lock:
            self.gate.check()
            if self._failed is not None:
                raise WritesStopped(refusal(self._failed))
            if self._closed or self._file is None:
                raise RuntimeError("write-ahead log is closed")
            handle = self._file
            start = handle.size
            try:
                handle.write(record)
            except OSError as error:
                self._refused_size = len(record)
                fault = self._fail("write", error, cut_to=start)
                raise WritesStopped(refusal(fault)) from error
            with self._cond:
                self._appended += 1
                self._written_size = handle.size
                self._cond.notify_all()
                return Appended(self._appended, self.generation, start, handle.size)

    def retract(self, appended: Appended) -> None:
        """Cut the last record back out: its write was not applied (it failed, or another
        table's record of the same request could not be written). A cut that fails
        stops writes, and the resume then checkpoints memory."""
        with self._write_lock:
            handle = self._file
            if handle is None or appended.generation != self.generation:
                return  # its segment was abandoned, already cut back to what was durable
            if handle.size > appended.end:
                raise RuntimeError("only the last record of a log can be retracted")
            try:
                if handle.size > appended.start:
                    handle.truncate(appended.start)
                    handle.sync()
            except OSError as error:
                self._fail("truncate", error, cut_to=None, diverged=True)
                return
            with self._cond:
                self._written_size = handle.size
                self._durable_size = min(self._durable_size, handle.size)

    async def durable(self, seq: int) -> None:
        """Return once record ``seq`` is fsynced; ``WriteNotDurable`` if the log lost it."""
        loop = asyncio.get_running_loop()
        with self._cond:
            self._raise_if_lost(seq)
            if self._settled >= seq:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((seq, loop, future))
        await future

    def wait_durable(self, seq: int | None = None) -> None:
        """Blocking form of ``durable``; default: everything appended so far, and
        ``WritesStopped`` while the log is failed."""
        with self._cond:
            target = self._appended if seq is None else seq
            self._cond.wait_for(lambda: self._settled >= target)
            if seq is not None:
                self._raise_if_lost(seq)
            elif self._failed is not None:
                raise WritesStopped(refusal(self._failed))

    def _raise_if_lost(self, seq: int) -> None:
        if any(first <= seq <= last for first, last in self._lost):
            fault = self._failed
            why = fault.describe() if fault is not None else "the log failed"
            raise WriteNotDurable(
                f"the write was applied in memory, but its log record is not durable ({why}); "
                "the node stopped accepting writes: do not resend it"
            )

    def rotate(self) -> int:
        """Start a new segment (caller holds the table lock); returns its generation.

        If the new segment cannot be made the log stays on the current one.
        """
        self.wait_durable()
        with self._write_lock:
            if self._failed is not None:
                raise WritesStopped(refusal(self._failed))
            return self._switch_segment()

    def reopen(self) -> None:
        """Continue a failed log on a fresh segment (its segment was abandoned): the probe
        of a disk that failed. Raises ``OSError`` while the disk still fails, or still
        lacks room for the record whose write failed (a disk with room for the probe
        alone would stop writes again at once)."""
        with self._cond:  # nothing can be appended to a failed log; let the flusher finish
            self._cond.wait_for(lambda: not self._syncing and self._settled >= self._appended)
        with self._write_lock:
            if self._failed is None:
                return
            free = shutil.disk_usage(self.directory).free
            if free < self._refused_size + len(MAGIC):
                raise OSError(
                    errno.ENOSPC,
                    f"{free} bytes free, the record that failed needs {self._refused_size}",
                    str(self.directory),
                )
            self._switch_segment()
            self._failed = None
            self._refused_size = 0

    def _switch_segment(self) -> int:
        fresh = self._open_segment(self.generation + 1)
        old, self._file = self._file, fresh
        self.generation += 1
        if old is not None:
            with contextlib.suppress(OSError):
                old.close()
        return self.generation

    def remove_before(self, generation: int) -> None:
        for old in generations(self.directory):
            if old < generation:
                segment_path(self.directory, old).unlink(missing_ok=True)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._flusher.join()
        with self._write_lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None

    def _fail(
        self, operation: str, error: BaseException, *, cut_to: int | None,
        diverged: bool = False,
    ) -> LogFault:  # fmt: skip
        """Stop this log (caller holds ``_write_lock``) and shut the node's gate;
        ``diverged``: memory and log no longer agree (see ``WriteGate.trip``).

        ``cut_to``: cut the segment back to that size first, so a restart never
        replays what was not acknowledged (a failed cut is only logged: the segment
        is abandoned, and replay stops at a torn record).
        """
        handle = self._file
        path = str(handle.path if handle is not None else self.directory)
        fault = LogFault.of(self.table, operation, path, error)
        log.error("wal: %s", fault.describe())
        if cut_to is not None and handle is not None:
            try:
                handle.truncate(cut_to)
                handle.sync()
            except OSError as cut_error:
                log.error(
                    "wal: could not cut %s back to %d bytes durably: %s", path, cut_to, cut_error
                )
        with self._cond:
            if self._failed is None:
                self._failed = fault
        self.gate.trip(fault, diverged=diverged)
        return fault

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                while self._settled >= self._appended and not self._closed:
                    self._cond.wait()
                if self._settled >= self._appended:
                    return
                upto, size, handle = self._appended, self._written_size, self._file
                self._syncing = True
            try:
                assert handle is not None  # a log with unsettled records has its segment open
                handle.sync()
            except Exception as error:  # a disk that fails loses the node's durability
                with self._write_lock:  # no append is half-way while the tail is cut
                    self._fail_sync(error)
                continue
            with self._cond:
                self._syncing = False
                self._settled = max(self._settled, upto)
                self._durable_size = size
                ready = [w for w in self._waiters if w[0] <= upto]
                self._waiters = [w for w in self._waiters if w[0] > upto]
                self._cond.notify_all()
            for _, loop, future in ready:
                loop.call_soon_threadsafe(_settle, future, None)

    def _fail_sync(self, error: BaseException) -> None:
        """An fsync failed: every record since the last good one is applied and lost."""
        with self._cond:
            first, last = self._settled + 1, self._appended
            durable_size = self._durable_size
        # The fault is recorded before the lost records are published: a writer told its
        # record is lost always learns why.
        fault = self._fail("fsync", error, cut_to=durable_size, diverged=first <= last)
        with self._cond:
            if first <= last:
                self._lost.append((first, last))
            self._settled = last
            waiting, self._waiters = self._waiters, []
            self._syncing = False
            self._cond.notify_all()
        failure = WriteNotDurable(
            f"the write was applied in memory, but its log record is not durable "
            f"({fault.describe()}); the node stopped accepting writes: do not resend it"
        )
        for _, loop, future in waiting:
            loop.call_soon_threadsafe(_settle, future, failure)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
