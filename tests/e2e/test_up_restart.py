"""`recstore up` killed with SIGKILL: its nodes stop with it, and a new `up` takes over.

The nodes of a killed platform must not live on as orphans that the next
platform's nodes fight for ports and data dirs (the next ones would run
recovery in a dir the old ones still append to). Here they stop by
themselves with a final checkpoint, a node left on a shard's dir by other
means is stopped before the new one starts, and every acknowledged row is
there after the restart.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch

from recstore import RecStoreClient
from recstore.core.data_dir import holder

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROWS, DIM = 500, 4


class Up:
    """``recstore up`` as a process of its own; ``url`` once it says it is up."""

    def __init__(self, state_dir: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "recstore", "up", "--state-dir", str(state_dir), "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=os.environ | {"COLUMNS": "200"},
        )  # fmt: skip
        assert self.process.stdout is not None
        self.output: list[str] = []
        for line in self.process.stdout:
            self.output.append(line)
            if "RecStore is up" in line:
                self.url = line.split("dashboard", 1)[1].strip().rstrip("/")
                break
        else:
            raise AssertionError("recstore up exited:\n" + "".join(self.output))
        self.token = (state_dir / "admin-token").read_text().strip()
        self.ps_token = (state_dir / "ps-token").read_text().strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=120)


@pytest.fixture
def ups() -> Iterator[list[Up]]:
    started: list[Up] = []
    yield started
    for up in reversed(started):
        up.stop()


def _wait_exit(pid: int, timeout: float) -> None:
    """Wait for a process that is not our child to exit (its pidfd turns readable)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
        assert readable, f"process {pid} still running after {timeout} s"
    finally:
        os.close(pidfd)


def test_killed_up_takes_its_nodes_along_and_a_new_one_takes_over(
    tmp_path: Path, ups: list[Up], helpers: SimpleNamespace
) -> None:
    state = tmp_path / "state"
    first = Up(state)
    ups.append(first)
    headers = {"Authorization": f"Bearer {first.token}"}
    spec = {"name": "kept", "numEmbeddings": ROWS, "embeddingDim": DIM, "shards": 2}
    httpx.post(f"{first.url}/api/v1/tables", json=spec, headers=headers).raise_for_status()
    helpers.wait_for(
        lambda: httpx.get(f"{first.url}/api/v1/tables/kept", headers=headers).json()["status"]
        .get("phase") == "Ready",
        90, "table kept Ready",
    )  # fmt: skip
    client = RecStoreClient(role="up-restart")
    client.set_admin_url(first.url, first.token, ps_token=first.ps_token)
    client.init_data("kept", (ROWS, DIM), torch.float32)
    rows = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(5))
    client.push("kept", torch.arange(ROWS), rows)  # acknowledged
    client.close()
    shard_dirs = [state / "tables" / "kept" / f"shard-{s}" for s in range(2)]
    nodes = [holder(d) for d in shard_dirs]
    assert all(nodes), nodes

    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    for pid in nodes:  # each stops by itself, writing its final checkpoint
        assert pid is not None
        _wait_exit(pid, 120)
    # A node left on shard 0's dir some other way (it will not stop by itself):
    leftover = subprocess.Popen(
        [sys.executable, "-m", "recstore", "ps-node", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(shard_dirs[0])],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert leftover.stderr is not None
    assert any('"ps node serving"' in line for line in leftover.stderr)

    second = Up(state)
    ups.append(second)
    assert leftover.wait(timeout=120) == 0  # stopped gracefully before shard 0 started
    headers = {"Authorization": f"Bearer {second.token}"}
    helpers.wait_for(
        lambda: httpx.get(f"{second.url}/api/v1/tables/kept", headers=headers).json()["status"]
        .get("phase") == "Ready",
        90, "table kept Ready again",
    )  # fmt: skip
    new_nodes = [holder(d) for d in shard_dirs]
    assert all(new_nodes) and not set(new_nodes) & {*nodes, leftover.pid}
    client = RecStoreClient(role="up-restart-2")
    client.set_admin_url(second.url, second.token, ps_token=second.ps_token)
    client.init_data("kept", (ROWS, DIM), torch.float32)
    torch.testing.assert_close(client.pull("kept", torch.arange(ROWS)), rows)
    client.close()


def test_up_keeps_its_state_to_its_owner_and_refuses_a_readable_token(tmp_path: Path) -> None:
    from recstore.local.state_dir import InsecureStateDir, ensure_token, secure_state_dir

    state = tmp_path / "state"
    secure_state_dir(state)
    token = ensure_token(state)
    assert len(token) >= 32
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "admin-token").stat().st_mode & 0o777 == 0o600
    assert ensure_token(state) == token  # kept across starts
    (state / "admin-token").chmod(0o644)
    with pytest.raises(InsecureStateDir, match="readable by other users"):
        ensure_token(state)
    up = subprocess.run(
        [sys.executable, "-m", "recstore", "up", "--state-dir", str(state), "--port", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert up.returncode == 1
    assert "chmod 600" in up.stderr and "Traceback" not in up.stderr + up.stdout
