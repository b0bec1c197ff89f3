"""Write-ahead log of one table: every acknowledged Push/Update survives kill -9.

A log is a directory of segments ``<generation>.wal``; each segment starts with
a magic and holds length-prefixed records with a CRC32. Writers append under
the table lock (so the log order is the apply order) and then wait for a
background flusher that writes everything pending with one fsync (group
commit) before they reply. A checkpoint rotates to a new segment and records
its generation; segments are deleted only below the generation of the oldest
checkpoint kept (``recstore.ps.persistence``), so a damaged newer checkpoint
can be passed over and an older one brought forward by the log. Replay stops a
segment at the first torn or corrupt record: it was never acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from recstore.core.wire import Buffer
from recstore.ps.codec import KEY_DTYPE, WIRE_DTYPES

log = logging.getLogger(__name__)

MAGIC = b"RSWAL001"
FRAME = struct.Struct("<II")  # payload length, crc32(payload)
HEAD = struct.Struct("<BBHIIf")  # op, dtype code, reserved, rows, dim, lr (NaN: none)
OP_PUSH = 1
OP_UPDATE = 2
DTYPE_CODES = {name: code for code, name in enumerate(WIRE_DTYPES)}
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}
Waiter = tuple[int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]


@dataclass(frozen=True)
class WalRecord:
    op: int
    keys: np.ndarray  # int64[rows]
    values: np.ndarray  # [rows, dim] of dtype (values for push, grads for update)
    dtype: str
    lr: float | None


def encode_record(
    op: int, keys: Buffer, values: Buffer, dtype: str, rows: int, dim: int, lr: float | None
) -> bytes:
    """One framed record; ``keys``/``values`` are the request's raw buffers."""
    head = HEAD.pack(op, DTYPE_CODES[dtype], 0, rows, dim, math.nan if lr is None else lr)
    payload = b"".join((head, keys, values))
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def decode_payload(payload: bytes) -> WalRecord:
    op, code, _, rows, dim, lr = HEAD.unpack_from(payload)
    dtype = DTYPE_NAMES[code]
    keys_end = HEAD.size + rows * KEY_DTYPE.itemsize
    keys = np.frombuffer(payload, KEY_DTYPE, rows, HEAD.size)
    values = np.frombuffer(payload, WIRE_DTYPES[dtype], rows * dim, keys_end).reshape(rows, dim)
    return WalRecord(op, keys, values, dtype, None if math.isnan(lr) else float(lr))


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


def replay(directory: Path, start_generation: int, apply: Callable[[WalRecord], None]) -> int:
    """Apply every record of segments >= ``start_generation`` in order; returns the count."""
    count = 0
    for generation in generations(directory):
        if generation < start_generation:
            continue
        for record in iter_records(segment_path(directory, generation).read_bytes()):
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
    """The open log of one table: append, group commit, rotate."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._cond = threading.Condition()
        self._pending: list[bytes] = []
        self._appended = 0  # sequence number of the last appended record
        self._durable = 0  # ... of the last record fsynced
        self._waiters: list[Waiter] = []
        self._error: OSError | None = None
        self._closed = False
        existing = generations(directory)
        self.generation = (existing[-1] + 1) if existing else 0
        self._file = self._open_segment(self.generation)
        self._flusher = threading.Thread(target=self._flush_loop, name="wal-flush", daemon=True)
        self._flusher.start()

    def _open_segment(self, generation: int) -> BinaryIO:
        handle = open(segment_path(self.directory, generation), "ab")  # noqa: SIM115
        handle.write(MAGIC)
        handle.flush()
        os.fsync(handle.fileno())
        fsync_dir(self.directory)
        return handle

    def append(self, record: bytes) -> int:
        """Queue a framed record; returns its sequence number (see ``durable``)."""
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise RuntimeError("write-ahead log is closed")
            self._pending.append(record)
            self._appended += 1
            self._cond.notify_all()
            return self._appended

    async def durable(self, seq: int) -> None:
        """Return once record ``seq`` is fsynced (raise if the disk failed)."""
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._durable >= seq:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((seq, loop, future))
        await future

    def wait_durable(self, seq: int | None = None) -> None:
        """Blocking form of ``durable`` (default: everything appended so far)."""
        with self._cond:
            target = self._appended if seq is None else seq
            while self._durable < target and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error

    def rotate(self) -> int:
        """Start a new segment (caller holds the table lock); returns its generation."""
        self.wait_durable()
        with self._cond:
            self._file.close()
            self.generation += 1
            self._file = self._open_segment(self.generation)
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
        self._file.close()

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                batch, self._pending = self._pending, []
                upto = self._appended
                handle = self._file
            error: OSError | None = None
            try:
                handle.write(b"".join(batch))
                handle.flush()
                os.fsync(handle.fileno())
            except OSError as exc:  # a disk that fails loses the node's durability
                log.error("wal: write to %s failed: %s", self.directory, exc)
                error = exc
            with self._cond:
                if error is None:
                    self._durable = upto
                else:
                    self._error = error
                ready: list[Waiter] = []
                waiting: list[Waiter] = []
                for waiter in self._waiters:
                    (ready if waiter[0] <= upto or error is not None else waiting).append(waiter)
                self._waiters = waiting
                self._cond.notify_all()
            for _, loop, future in ready:
                loop.call_soon_threadsafe(_settle, future, error)


def _settle(future: asyncio.Future[None], error: OSError | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
