"""PS nodes left over from an earlier run of ``recstore up``: stopped before new ones start.

A node holds its data dir's lock (``recstore.core.data_dir``) until it exits,
so a new node there would only fail and be restarted in a loop. The nodes of
this platform stop by themselves when it exits (``--parent-pid``), but one may
still be writing its final checkpoint when the platform is started again, and
a node started some other way never stops by itself. Before it starts a shard,
the provisioner stops whatever node still holds that shard's dir: SIGTERM
(drain, final checkpoint), then SIGKILL if it has not exited within the grace
period. A lock holder that is not a RecStore PS node on that dir is never
signalled: that is an error for a person to look at.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
from pathlib import Path

from recstore.core.data_dir import holder

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 60.0


class ForeignLockHolder(RuntimeError):
    """The data dir's lock is held by a process that is not a PS node serving it."""


def is_node_of(pid: int, data_dir: Path) -> bool:
    """Whether process ``pid`` is a RecStore PS node started on ``data_dir``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    args = [a.decode(errors="replace") for a in argv]
    if "--data-dir" not in args[:-1]:
        return False
    given = Path(args[args.index("--data-dir") + 1])
    cwd = Path(f"/proc/{pid}/cwd")
    with_cwd = given if given.is_absolute() else cwd.resolve() / given
    is_node = "ps-node" in args or "recstore.ps" in args
    return is_node and with_cwd.resolve() == data_dir.resolve()


def stop_leftover(data_dir: Path, *, grace: float = DEFAULT_GRACE_S) -> int | None:
    """Stop the node still holding ``data_dir`` (its pid), or None when the dir is free."""
    pid = holder(data_dir)
    if pid is None:
        return None
    if not is_node_of(pid, data_dir):
        raise ForeignLockHolder(
            f"data dir {data_dir} is locked by pid {pid}, which is not a RecStore PS node on "
            "it; stop that process, then start the platform again"
        )
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return pid  # exited meanwhile
    try:
        log.warning("stopping PS node %d left over on %s", pid, data_dir)
        _signal(pidfd, signal.SIGTERM)
        if not _exits_within(pidfd, grace):
            log.warning("PS node %d did not stop within %.0f s: killing it", pid, grace)
            _signal(pidfd, signal.SIGKILL)
            _exits_within(pidfd, None)
    finally:
        os.close(pidfd)
    return pid


def _signal(pidfd: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited already
        signal.pidfd_send_signal(pidfd, signum)


def _exits_within(pidfd: int, timeout: float | None) -> bool:
    """Wait for the process behind ``pidfd`` to exit (the fd turns readable)."""
    readable, _, _ = select.select([pidfd], [], [], timeout)
    return bool(readable)
