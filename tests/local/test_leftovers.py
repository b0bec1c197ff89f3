"""A PS node left on a shard's data dir is stopped before a new one starts; nothing else is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recstore.core.data_dir import holder
from recstore.local.leftovers import ForeignLockHolder, is_node_of, stop_leftover


def _node(data_dir: Path) -> subprocess.Popen[str]:
    """A PS node started by hand (no --parent-pid: it never stops by itself); serving on return."""
    process = subprocess.Popen(
        [sys.executable, "-m", "recstore", "ps-node", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(data_dir)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    for line in process.stderr:
        if '"ps node serving"' in line:
            return process
    raise AssertionError(f"node exited with {process.wait()} before serving")


def test_a_free_data_dir_needs_nothing(tmp_path: Path) -> None:
    assert stop_leftover(tmp_path) is None


def test_a_leftover_node_is_stopped_gracefully(tmp_path: Path) -> None:
    data_dir = tmp_path / "shard-0"
    node = _node(data_dir)
    try:
        assert is_node_of(node.pid, data_dir) and not is_node_of(node.pid, tmp_path)
        assert stop_leftover(data_dir) == node.pid
        assert node.wait(timeout=120) == 0  # SIGTERM: drained, final checkpoint, exit 0
        assert holder(data_dir) is None
    finally:
        node.kill()
        node.wait()


def test_a_node_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    data_dir = tmp_path / "shard-0"
    node = _node(data_dir)
    try:
        node.send_signal(19)  # SIGSTOP: it cannot act on SIGTERM any more
        assert stop_leftover(data_dir, grace=0.5) == node.pid
        assert node.wait(timeout=120) == -9
        assert holder(data_dir) is None
    finally:
        node.kill()
        node.wait()


def test_a_lock_held_by_something_else_is_an_error_and_nothing_is_signalled(
    tmp_path: Path,
) -> None:
    (tmp_path / "LOCK").touch()
    script = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({json.dumps(str(tmp_path / 'LOCK'))}, os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, str(os.getpid()).encode())\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "locked\n"
        with pytest.raises(ForeignLockHolder, match=f"locked by pid {other.pid}"):
            stop_leftover(tmp_path)
        assert other.poll() is None  # untouched
    finally:
        other.kill()
        other.wait()
