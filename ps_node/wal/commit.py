"""Group commit and fail-stop of a table's write-ahead log: when a logged write is durable.

``TableWal`` (``recstore.ps.wal.table_log``) appends the records; this half settles
them. A background flusher fsyncs everything appended so far with one fsync
and wakes every writer waiting on a record it covered (group commit). An fsync
that fails cuts the segment back to what was durable and fails every writer
waiting: their writes are applied, not durable (``WriteNotDurable``). Any
failure of the log shuts the node's ``WriteGate`` and leaves ``fault`` set
until ``TableWal.reopen`` continues on a fresh segment.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from recstore.core import WriteNotDurable, WritesStopped
from recstore.ps.wal.segment_file import SegmentFile
from recstore.ps.wal.write_gate import LogFault, WriteGate, refusal

log = logging.getLogger(__name__)

Waiter = tuple[int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class GroupCommit:
    """The settling half of ``TableWal``: its flusher, its waiting writers, its fault."""

    # set by TableWal: the log these records belong to and the segment open now
    directory: Path
    table: str
    gate: WriteGate
    _file: SegmentFile | None

    def __init__(self) -> None:
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
        self._waiters: list[Waiter] = []
        self._closed = False

    @property
    def fault(self) -> LogFault | None:
        """Why this log stopped (it abandoned its segment), None while it works."""
        return self._failed

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
                handle.cut(cut_to)
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
                if handle is self._file:  # not a segment rotated away meanwhile
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
