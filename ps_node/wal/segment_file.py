"""The file a write-ahead log segment is written through: the one seam to the disk.

``TableWal`` writes, fsyncs and cuts back its segments only through a
``SegmentFile``, and opens them only through a ``SegmentOpener`` the node is
given, so a test can hand the node files that fail the way a full or broken
disk does (``ENOSPC`` on a write, ``EIO`` on an fsync) without patching the
log's internals. Writes go straight to the kernel (no user-space buffer): a
write that returns has reached the page cache, and one that fails says so at
once, before the caller applies anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

#: a fresh segment: created empty (a half-made one of a failed attempt is overwritten)
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC


class SegmentFile:
    """One open segment: append, fsync, truncate; each raises ``OSError`` as the disk does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, _FLAGS, 0o644)
        #: bytes in the file: every write that returned, less any cut
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append all of ``data``; on failure a prefix of it may be in the file."""
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            self.size += written
            view = view[written:]

    def sync(self) -> None:
        os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (the caller fsyncs)."""
        os.ftruncate(self._fd, size)
        self.size = size

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


#: opens a fresh segment at a path (``SegmentFile`` itself, or a test's faulty files)
SegmentOpener = Callable[[Path], SegmentFile]
