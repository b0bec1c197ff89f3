"""One node per data dir (an exclusive lock), nodes that stop with their parent, read-only dirs."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recstore.core.data_dir import DataDirInUse, holder
from recstore.ps.serve.server import start_in_thread

from .conftest import Client, MountTmpfs, spec


def _files(data_dir: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``data_dir``: size, mtime and content hash."""
    return {
        str(p.relative_to(data_dir)): (
            p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()
        )
        for p in sorted(data_dir.rglob("*"))
        if p.is_file()
    }  # fmt: skip


def test_a_second_node_on_a_data_dir_exits_and_touches_nothing(tmp_path: Path, spawn) -> None:
    data_dir = tmp_path / "node"
    first = spawn(data_dir, "--durability", "wal")
    client = Client(first.address)
    client.create(spec(num_embeddings=100, embedding_dim=4))
    client.push("emb", [1, 2], np.full((2, 4), 3.0, np.float32))
    before = _files(data_dir)
    second = subprocess.run(
        [sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(data_dir), "--durability", "wal"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert second.returncode == 3, second.stderr
    assert f"data dir {data_dir} is in use by PS node pid {first.process.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    assert _files(data_dir) == before  # no recovery ran, nothing was appended
    np.testing.assert_array_equal(client.pull("emb", [1, 2]), np.full((2, 4), 3.0))
    assert holder(data_dir) == first.process.pid


def test_deleting_lock_under_a_live_node_does_not_let_a_second_one_in(
    tmp_path: Path, spawn
) -> None:
    data_dir = tmp_path / "node"
    first = spawn(data_dir, "--durability", "wal")
    client = Client(first.address)
    client.create(spec(num_embeddings=100, embedding_dim=4))
    client.push("emb", [1], np.full((1, 4), 3.0, np.float32))
    (data_dir / "LOCK").unlink()  # an operator's cleanup, or an attacker
    before = _files(data_dir)
    second = subprocess.run(
        [sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(data_dir), "--durability", "wal"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert second.returncode == 3, second.stderr
    assert f"data dir {data_dir} is in use by PS node pid {first.process.pid}" in second.stderr
    assert _files(data_dir) == before  # no LOCK made anew, no recovery, nothing appended
    assert holder(data_dir) == first.process.pid
    np.testing.assert_array_equal(client.pull("emb", [1]), np.full((1, 4), 3.0))
    first.kill()
    assert holder(data_dir) is None  # the kernel dropped both locks with the process
    restarted = spawn(data_dir, "--durability", "wal")
    assert holder(data_dir) == restarted.process.pid


def test_in_process_the_second_node_is_refused_until_the_first_stops(tmp_path: Path) -> None:
    first = start_in_thread(data_dir=tmp_path)
    try:
        with pytest.raises(DataDirInUse, match=f"in use by PS node pid {os.getpid()}"):
            start_in_thread(data_dir=tmp_path)
    finally:
        first.stop(final_checkpoint=False)
    assert holder(tmp_path) is None
    start_in_thread(data_dir=tmp_path).stop(final_checkpoint=False)


def test_a_killed_node_leaves_no_lock_behind(tmp_path: Path, spawn) -> None:
    data_dir = tmp_path / "node"
    spawn(data_dir).kill()
    assert (data_dir / "LOCK").exists() and holder(data_dir) is None
    restarted = spawn(data_dir)  # the stale file names a dead pid: it blocks nothing
    assert holder(data_dir) == restarted.process.pid


def test_a_node_stops_with_a_final_checkpoint_when_its_parent_dies(tmp_path: Path, spawn) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    data_dir = tmp_path / "node"
    try:
        node = spawn(data_dir, "--parent-pid", str(parent.pid))
        client = Client(node.address)
        client.create(spec(num_embeddings=100, embedding_dim=4))
        client.push("emb", [7], np.full((1, 4), 5.0, np.float32))
        client.close()
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert node.process.wait(timeout=120) == 0
    node.wait_for("final checkpoint written", 10)
    restarted = Client(spawn(data_dir).address)
    np.testing.assert_array_equal(restarted.pull("emb", [7]), np.full((1, 4), 5.0))


def test_a_node_whose_parent_is_already_gone_does_not_serve(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    node = subprocess.run(
        [sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(tmp_path), "--parent-pid", str(gone.pid)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert node.returncode == 0, node.stderr
    assert f"parent process {gone.pid} is gone" in node.stderr


def test_sigterm_when_checkpoints_cannot_be_written_ends_with_a_clear_error(
    tmp_path: Path, spawn, mounts: MountTmpfs
) -> None:
    data_dir = tmp_path / "node"
    node = spawn(data_dir)
    client = Client(node.address)
    client.create(spec(num_embeddings=100, embedding_dim=4))
    client.push("emb", [1], np.full((1, 4), 2.0, np.float32))
    client.close()
    checkpoints = data_dir / "checkpoints"
    mounts(checkpoints, "ro,size=1m")  # the node's checkpoints now land on a read-only fs
    assert node.terminate() == 1
    node.wait_for("ps node stopped", 10)
    log = "".join(node.log)
    assert "final checkpoint failed" in log and "Read-only file system" in log
    assert "Traceback" not in log


def test_a_node_on_a_read_only_data_dir_says_so_and_exits(
    tmp_path: Path, mounts: MountTmpfs
) -> None:
    data_dir = tmp_path / "ro"
    mounts(data_dir, "ro,size=1m")
    node = subprocess.run(
        [sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert node.returncode == 1
    assert f"data dir {data_dir} is not usable: Read-only file system" in node.stderr
    assert "Traceback" not in node.stderr
