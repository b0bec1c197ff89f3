"""One PS node per data dir: an exclusive lock held for the node's lifetime.

Two processes recovering from and appending to one write-ahead log tear it.
Like PostgreSQL's ``postmaster.pid`` and etcd's WAL lock, a node takes an
exclusive ``flock`` on ``<data_dir>/LOCK`` before it reads or writes anything
else there and writes its pid into the file; the kernel drops the lock when
the process dies, however it dies, so a stale file never blocks a restart. A
second node on the same dir fails at once (``DataDirInUse``, naming the
holder) and has touched nothing. The local provisioner uses ``holder`` to
find a node left over from an earlier run before it starts a new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from recstore.core.errors import RecStoreError

LOCK_FILE = "LOCK"


class DataDirInUse(RecStoreError):
    """Another live process holds the data dir's lock."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        holder = f"PS node pid {pid}" if pid else "another process"
        super().__init__(
            f"data dir {data_dir} is in use by {holder}; refusing to start a second node on it "
            "(stop that one first)"
        )
        self.data_dir, self.pid = data_dir, pid


class DataDirUnusable(RecStoreError):
    """The data dir cannot be locked, read or written (a node cannot start on it)."""

    def __init__(self, data_dir: Path, error: OSError) -> None:
        where = f" ({error.filename})" if error.filename else ""
        super().__init__(f"data dir {data_dir} is not usable: {error.strerror}{where}")
        self.data_dir = data_dir


class DataDirLock:
    """The held lock of one data dir (``acquire``); ``release`` or process exit frees it."""

    def __init__(self, data_dir: Path, fd: int) -> None:
        self.data_dir, self._fd = data_dir, fd

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Lock ``data_dir`` (created if missing) for this process; ``DataDirInUse`` if held."""
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:  # e.g. a read-only dir: a node could not write there anyway
            raise DataDirUnusable(data_dir, error) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise DataDirInUse(data_dir, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(data_dir, fd)

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the last descriptor drops the flock


def holder(data_dir: Path) -> int | None:
    """The pid of the live process holding ``data_dir``'s lock; None when nobody holds it."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or None
        fcntl.flock(fd, fcntl.LOCK_UN)  # free: whatever pid the file names is gone
        return None
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip())
    return None
