"""The open write-ahead log of one table: every acknowledged Push/Update survives kill -9.

A writer appends its record (``recstore.ps.wal.records``) under the table lock (so the
log order is the apply order) and only then applies the write; it replies once
the record is fsynced (``recstore.ps.wal.commit``: group commit). A checkpoint
rotates to a new segment (``recstore.ps.wal.segments``), and so does a segment
that is full: each is created at a fixed length (``records.SEGMENT_BYTES``, or
what its first record needs) and written in place. Each segment's header
records where its predecessor's acknowledged records end and its own length,
and each record its index in the segment, so a replay tells a damaged or cut
log from a clean end.

Fail-stop: a record that cannot be written is cut back out and refused
(nothing applied); an fsync that fails cuts the segment back to what was
durable and fails every writer waiting (their writes are applied, not
durable). Either way the log shuts the node's ``WriteGate`` and abandons its
segment; ``reopen`` continues on a fresh one once the disk works again.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recstore.core import WritesStopped
from recstore.ps.wal.commit import GroupCommit
from recstore.ps.wal.records import (
    FRAME,
    HEADER_SIZE,
    NO_PREDECESSOR,
    SEGMENT_BYTES,
    frame,
    segment_header,
)
from recstore.ps.wal.segment_file import SegmentFile, SegmentOpener
from recstore.ps.wal.segments import (
    fsync_path,
    generations,
    record_newest,
    records_end,
    segment_path,
)
from recstore.ps.wal.write_gate import WriteGate, refusal


@dataclass(frozen=True)
class Appended:
    """Where one appended record went: its sequence number and bytes in its segment."""

    seq: int
    generation: int
    index: int  # in its segment
    start: int
    end: int


class TableWal(GroupCommit):
    """The open log of one table: append before apply, group commit, rotate, fail-stop."""

    def __init__(
        self,
        directory: Path,
        *,
        table: str = "",
        gate: WriteGate | None = None,
        files: SegmentOpener = SegmentFile,
        opening: Callable[[], bytes] | None = None,
        first_generation: int = 0,
        predecessor_end: int | None = None,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        """``first_generation``: the lowest generation the fresh segment may take (a
        checkpoint's, whose segments were cut away); ``predecessor_end``: where the
        intact records of the segment before it end (read from it when not given);
        ``segment_bytes``: a segment's length unless a record needs more."""
        self.directory = directory
        #: the record every fresh segment starts with (the table's de-dup window)
        self._opening = opening
        self.table = table or directory.name
        self.gate = gate if gate is not None else WriteGate()
        self._files = files
        self._segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__()
        self._refused_size = 0  # bytes of the record whose write failed
        self._next_index = 0  # of the next record in the open segment
        existing = generations(directory)
        self.generation = max((existing[-1] + 1) if existing else 0, first_generation)
        if predecessor_end is None:
            before = self.generation - 1
            predecessor_end = records_end(directory, before) if before in existing else None
        self._file = self._open_segment(
            self.generation, NO_PREDECESSOR if predecessor_end is None else predecessor_end
        )
        self._flusher = threading.Thread(target=self._flush_loop, name="wal-flush", daemon=True)
        self._flusher.start()

    def _open_segment(self, generation: int, predecessor_end: int, need: int = 0) -> SegmentFile:
        """A fresh segment, room in it for a record of ``need`` bytes, holding its header
        and opening record, fsynced with its directory entry, then named the newest."""
        path = segment_path(self.directory, generation)
        opening = [self._opening()] if self._opening is not None else []
        framed = b"".join(frame(payload, index) for index, payload in enumerate(opening))
        length = max(self._segment_bytes, HEADER_SIZE + len(framed) + need)
        handle = self._files(path)
        try:
            handle.write(segment_header(generation, predecessor_end, length) + framed)
            handle.extend(length)
            handle.sync()
            fsync_path(self.directory)
            record_newest(self.directory, generation)
        except BaseException:
            with contextlib.suppress(OSError):
                handle.close()
                path.unlink(missing_ok=True)
            raise
        self._next_index = len(opening)
        with self._cond:
            self._written_size = self._durable_size = handle.size
        return handle

    def append(self, payload: bytes) -> Appended:
        """Write a record (framed here) before its write is applied (see ``durable``);
        a segment too full for it is followed by a fresh one first.

        Raises ``WritesStopped`` when the record is not in the log: the caller
        applies nothing.
        """
        need = FRAME.size + len(payload)
        while True:
            with self._write_lock:
                self.gate.check()
                if self._failed is not None:
                    raise WritesStopped(refusal(self._failed))
                if self._closed or self._file is None:
                    raise RuntimeError("write-ahead log is closed")
                handle = self._file
                if handle.size + need <= handle.length:
                    return self._write(handle, frame(payload, self._next_index))
            self._rotate(need)

    def _write(self, handle: SegmentFile, record: bytes) -> Appended:
        start, index = handle.size, self._next_index
        try:
            handle.write(record)
        except OSError as error:
            self._refused_size = len(record)
            fault = self._fail("write", error, cut_to=start)
            raise WritesStopped(refusal(fault)) from error
        self._next_index += 1
        with self._cond:
            self._appended += 1
            self._written_size = handle.size
            self._cond.notify_all()
            return Appended(self._appended, self.generation, index, start, handle.size)

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
                    handle.cut(appended.start)
                    handle.sync()
            except OSError as error:
                self._fail("cut", error, cut_to=None, diverged=True)
                return
            self._next_index = appended.index
            with self._cond:
                self._written_size = handle.size
                self._durable_size = min(self._durable_size, handle.size)

    def rotate(self) -> int:
        """Start a new segment (caller holds the table lock); returns its generation.

        If the new segment cannot be made the log stays on the current one.
        """
        return self._rotate(0)

    def _rotate(self, need: int) -> int:
        """Continue on a new segment with room for a record of ``need`` bytes, once what
        the current one holds is durable (so its successor records where it ends)."""
        self.wait_durable()
        with self._write_lock:
            if self._failed is not None:
                raise WritesStopped(refusal(self._failed))
            return self._switch_segment(need)

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
            if free < self._refused_size + HEADER_SIZE + FRAME.size:
                raise OSError(
                    errno.ENOSPC,
                    f"{free} bytes free, the record that failed needs {self._refused_size}",
                    str(self.directory),
                )
            self._switch_segment(self._refused_size)
            self._failed = None
            self._refused_size = 0

    def _switch_segment(self, need: int = 0) -> int:
        """Continue on the next segment, recording where this one's acknowledged records
        end (what a failed cut left after them is ignored by a replay)."""
        with self._cond:
            predecessor_end = self._durable_size
        fresh = self._open_segment(self.generation + 1, predecessor_end, need)
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
