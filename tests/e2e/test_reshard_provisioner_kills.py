"""kill -9 of `recstore up` (admin API, provisioner and the move's runner) at each step
of an online move, then `recstore up` again: the move resumes and the table ends
consistent.

The platform runs in a subprocess (``platform_until_step.py``) whose runner
blocks at step ``STEPS[i]`` of batch i; the test kills the whole process there
and starts the next one on the same state dir and port, which aborts or
finishes that batch from what was stored and goes on to stop at the next step.
Its nodes stop when it dies (``--parent-pid``) and come back with the rows of
their data directories (WAL durability). A trainer runs all along; its update
in flight at a kill is resent once the nodes are back, and applied once. Each
new run finishes or aborts the batch it found, then waits for the test's
go-ahead before the next batch: that update must be through first, since the
run then seals slots it may touch and freezes holding them.

One move of more batches than steps, one kill per batch, covers all nine steps
(begin, snapshot, catch-up, seal, tail, verify, commit, activate, cleanup) with
nine restarts. A restart is the platform's imports and start and its nodes'
(about 10 s on an idle 2-core machine); the subprocess imports no torch (the
trainer's), which had doubled that. The in-process crash at every step is in
tests/ps/test_migration_online.py, node kills at every step in
test_reshard_kills_local.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from recstore.local.platform import LocalPlatform
from recstore.local.ports import free_port

from .reshard_faults import BATCH_SLOTS, NAME, ROWS, SPEC, STEPS, Trainer, node_rows

# a whole move with restarts: bounded by the waits below, longer than the default timeout
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

HELPER = Path(__file__).with_name("platform_until_step.py")


class Stopping:
    """One `recstore up` in a subprocess, stopping at ``step`` of ``batch``."""

    def __init__(self, state: Path, port: int, batch: int, step: str, helpers: SimpleNamespace):
        self.stopped = state / "stopped-at"
        self.stopped.unlink(missing_ok=True)
        (state / "up").unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, str(HELPER), str(state), str(port), str(batch), step],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=open(state.parent / f"up-{batch}.log", "wb"),  # noqa: SIM115
        )
        self.at = f"{batch} {step}"
        self.url = f"http://127.0.0.1:{port}"
        helpers.wait_for(lambda: (state / "up").exists() or self.process.poll() is not None, 120,
                         "the platform up")  # fmt: skip
        assert self.process.poll() is None, f"`recstore up` exited ({self.process.returncode})"

    def go(self) -> None:
        """Let the runner begin its batch (it waits for this after resuming)."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        self.process.stdin.flush()

    def reached(self) -> bool:
        return self.stopped.exists() and self.stopped.read_text() == self.at

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        if self.process.stdin is not None:
            self.process.stdin.close()


def test_the_provisioner_killed_at_each_step_of_a_move(
    tmp_path: Path, helpers: SimpleNamespace
) -> None:
    state, port = tmp_path / "state", free_port()
    state.mkdir(mode=0o700)
    up = Stopping(state, port, 0, STEPS[0], helpers)
    trainer: Trainer | None = None
    try:
        token = (state / "admin-token").read_text().strip()
        ps_token = (state / "ps-token").read_text().strip()
        api = helpers.Api(SimpleNamespace(url=up.url, token=token, tls=None))
        api.create_table(SPEC)
        api.wait_ready(NAME)
        trainer = Trainer(up.url, token, ps_token, "kill-provisioner")
        api.http.patch(f"/tables/{NAME}", json={"shards": 3}).raise_for_status()
        api.http.close()
        up.go()
        for batch in range(1, len(STEPS) + 1):
            helpers.wait_for(up.reached, 300, f"the move at {up.at}")
            trainer.hold()  # no new update until the next platform is up
            up.kill()
            if batch == len(STEPS):
                break
            up = Stopping(state, port, batch, STEPS[batch], helpers)
            trainer.pause()  # the update in flight at the kill is through
            up.go()
            trainer.resume()
    finally:
        if up.process.poll() is None:
            up.kill()
    final = LocalPlatform(state, port=port, poll_interval=0.1, reshard_batch_slots=BATCH_SLOTS)
    final.start()
    try:
        trainer.pause()
        trainer.resume()
        api = helpers.Api(final)

        def done() -> bool:
            status = api.table(NAME)["status"]
            moving = {c["type"]: c for c in status.get("conditions", [])}
            finished = moving.get("Resharding", {}).get("reason") == "MoveDone"
            return finished and status.get("phase") == "Ready" and len(status["shards"]) == 3

        helpers.wait_for(done, 600, "the move to 3 shards")
        trainer.finish()
        assert sum(node_rows(final.provisioner.endpoints(NAME), final.ps_token)) == ROWS
        stored = json.loads((state / "tables" / NAME / "migration.json").read_text())
        assert len(stored["job"]["batches"]) > len(STEPS)  # each kill in a batch of its own
        assert stored["slot_map"]["epoch"] == 1 + len(stored["job"]["batches"])
        api.http.close()
    finally:
        final.stop()
