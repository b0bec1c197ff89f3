"""One PS node per data dir: an exclusive lock held for the node's lifetime.

Two processes recovering from and appending to one write-ahead log tear it.
Like PostgreSQL's ``postmaster.pid`` and etcd's WAL lock, a node takes an
exclusive ``flock`` before it reads or writes anything else there: on the data
dir itself, which no file deletion can free, and on ``<data_dir>/LOCK``, into
which it writes its pid (for the error a second node gets, and for nodes of
earlier releases, which lock that file alone). The kernel drops the locks when
the process dies, however it dies, so a stale file never blocks a restart. A
second node on the same dir fails at once (``DataDirInUse``, naming the
holder) and has touched nothing, even when ``LOCK`` was deleted under the
first. The local provisioner uses ``holder`` to find a node left over from an
earlier run before it starts a new one.
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

    def __init__(self, data_dir: Path, fds: tuple[int, ...]) -> None:
        self.data_dir, self._fds = data_dir, fds

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Lock ``data_dir`` (created if missing) for this process; ``DataDirInUse`` if held."""
        data_dir.mkdir(parents=True, exist_ok=True)
        held: list[int] = []
        try:
            for path, flags in (
                (data_dir, os.O_RDONLY | os.O_DIRECTORY),
                (data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT),
            ):
                try:  # e.g. a read-only dir: a node could not write there anyway
                    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
                except OSError as error:
                    raise DataDirUnusable(data_dir, error) from None
                held.append(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise DataDirInUse(data_dir, _holder_pid(data_dir)) from None
        except BaseException:
            for fd in held:
                os.close(fd)
            raise
        lock_file = held[-1]
        os.ftruncate(lock_file, 0)
        os.pwrite(lock_file, f"{os.getpid()}\n".encode(), 0)
        return cls(data_dir, tuple(held))

    def release(self) -> None:
        fds, self._fds = self._fds, ()
        for fd in reversed(fds):
            os.close(fd)  # closing the last descriptor drops the flock


def holder(data_dir: Path) -> int | None:
    """The pid of the live process holding ``data_dir``'s lock; None when nobody holds it."""
    for path, flags in ((data_dir, os.O_RDONLY | os.O_DIRECTORY), (data_dir / LOCK_FILE, 0)):
        try:
            fd = os.open(path, os.O_RDONLY | flags | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _holder_pid(data_dir)
            fcntl.flock(fd, fcntl.LOCK_UN)  # free: whatever pid the file names is gone
        finally:
            os.close(fd)
    return None


def _holder_pid(data_dir: Path) -> int | None:
    """Who holds the lock: the pid ``LOCK`` names, else (``LOCK`` deleted) the kernel's
    record of the flock on the dir (/proc/locks)."""
    with contextlib.suppress(OSError, ValueError):
        return int((data_dir / LOCK_FILE).read_text().strip())
    with contextlib.suppress(OSError, ValueError):
        stat = os.stat(data_dir)
        inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if fields[1:3] == ["FLOCK", "ADVISORY"] and fields[5] == inode:
                return int(fields[4])
    return None
