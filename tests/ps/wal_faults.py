"""A disk that fails on demand, for write-ahead logs: what a node is given as ``wal_files``.

Segment files opened through a ``FailingDisk`` behave like real ones (they are
real files) until the test makes writes or fsyncs fail with the errno a full or
broken disk gives; a failing write can first write part of its bytes (a torn
record), and a fault can be limited to the segments of some tables.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

from recstore.ps.wal.segment_file import SegmentFile

PathFilter = Callable[[Path], bool]


def _every(path: Path) -> bool:
    return True


class FailingDisk:
    """The opener of segment files whose writes or fsyncs raise while a fault is set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._write_errno: int | None = None
        self._sync_errno: int | None = None
        self._torn = False
        self._where: PathFilter = _every
        self.writes_failed = 0
        self.syncs_failed = 0

    def __call__(self, path: Path) -> SegmentFile:
        return _FailingSegment(path, self)

    def fail_writes(
        self, number: int = errno.ENOSPC, *, torn: bool = True, where: PathFilter = _every
    ) -> None:
        """Writes fail with ``number`` (a torn one first writes half its bytes)."""
        with self._lock:
            self._write_errno, self._torn, self._where = number, torn, where

    def fail_syncs(self, number: int = errno.EIO, *, where: PathFilter = _every) -> None:
        with self._lock:
            self._sync_errno, self._where = number, where

    def heal(self) -> None:
        with self._lock:
            self._write_errno = self._sync_errno = None
            self._where = _every

    def write_fault(self, path: Path) -> tuple[int | None, bool]:
        with self._lock:
            if self._write_errno is None or not self._where(path):
                return None, False
            self.writes_failed += 1
            return self._write_errno, self._torn

    def sync_fault(self, path: Path) -> int | None:
        with self._lock:
            if self._sync_errno is None or not self._where(path):
                return None
            self.syncs_failed += 1
            return self._sync_errno


def _error(number: int, path: Path) -> OSError:
    return OSError(number, os.strerror(number), str(path))


class _FailingSegment(SegmentFile):
    def __init__(self, path: Path, disk: FailingDisk) -> None:
        super().__init__(path)
        self._disk = disk

    def write(self, data: bytes | memoryview) -> None:
        number, torn = self._disk.write_fault(self.path)
        if number is None:
            super().write(data)
            return
        if torn and len(data) > 1:
            super().write(memoryview(data)[: len(data) // 2])
        raise _error(number, self.path)

    def sync(self) -> None:
        number = self._disk.sync_fault(self.path)
        if number is not None:
            raise _error(number, self.path)
        super().sync()
