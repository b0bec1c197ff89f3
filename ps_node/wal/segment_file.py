"""The file a write-ahead log segment is written through and read from: the seam to the disk.

``TableWal`` writes, fsyncs and cuts back its segments only through a
``SegmentFile``, and opens them only through a ``SegmentOpener`` the node is
given, so a test can hand the node files that fail the way a full or broken
disk does (``ENOSPC`` on a write, ``EIO`` on an fsync) without patching the
log's internals. Writes go straight to the kernel (no user-space buffer): a
write that returns has reached the page cache, and one that fails says so at
once, before the caller applies anything.

A segment is created at its full length, a sparse file: its records are written
in place from the front, and records cut back out are overwritten with zeros,
so the file keeps the length its header records (a shorter file is a cut).
``read_segment`` reads what a segment holds without reading its unwritten rest.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

#: a fresh segment: created empty (a half-made one of a failed attempt is overwritten)
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_ZEROS = bytes(1 << 16)


class SegmentFile:
    """One open segment: write in place, extend, fsync, cut back; each raises ``OSError``
    as the disk does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, _FLAGS, 0o644)
        #: where its records end: every write that returned, less any cut
        self.size = 0
        #: the file's length (set by ``extend``)
        self.length = 0

    def write(self, data: bytes | memoryview) -> None:
        """Write all of ``data`` where the records end; on failure a prefix of it may be
        in the file."""
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, self.size)
            self.size += written
            view = view[written:]

    def extend(self, length: int) -> None:
        """Give the file its full length (a hole: no disk space until written)."""
        os.ftruncate(self._fd, length)
        self.length = length

    def sync(self) -> None:
        os.fsync(self._fd)

    def cut(self, size: int) -> None:
        """Cut the records back to ``size`` bytes: what followed is overwritten with zeros,
        blocks the disk has already given (the caller fsyncs)."""
        position = size
        while position < self.size:
            position += os.pwrite(self._fd, _ZEROS[: self.size - position], position)
        self.size = size

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


#: opens a fresh segment at a path (``SegmentFile`` itself, or a test's faulty files)
SegmentOpener = Callable[[Path], SegmentFile]


def read_segment(path: Path) -> tuple[bytes, int]:
    """(the bytes of ``path`` up to where it was never written, its size): a segment's
    unwritten rest is a hole, not read. The bytes past what is returned read as zeros."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        written = _written_extent(fd, size)
        chunks, position = [], 0
        while position < written:
            chunk = os.pread(fd, min(written - position, 1 << 24), position)
            if not chunk:
                break  # the file shrank while read: what was read is what there is
            chunks.append(chunk)
            position += len(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)


def _written_extent(fd: int, size: int) -> int:
    """Where the file's data ends when a hole runs from there to its end; else its size
    (a file system without holes, or data after one)."""
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:
        return size
    if hole >= size:
        return size
    try:
        os.lseek(fd, hole, os.SEEK_DATA)
    except OSError as error:
        if error.errno == errno.ENXIO:  # no data after the hole
            return hole
        raise
    return size  # data after a hole: read it all
