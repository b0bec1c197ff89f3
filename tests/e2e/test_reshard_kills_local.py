"""kill -9 of a node at each step of an online move on the local platform (2 -> 3 shards).

One move of many batches per role: at batch i the source (or the target) is
killed at step ``STEPS[i]``, right as the runner reaches it; the supervisor
restarts the node from its data directory (WAL durability), the provisioner
aborts or finishes the batch and resumes the move. A trainer runs all along;
every row must end as the exact sum of its acknowledged updates, and the nodes
together hold each row once (no copy left on a source or a target).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from recstore.core.reshard.plan import ReshardJob
from recstore.core.reshard.protocol import ReshardRun
from recstore.local.platform import LocalPlatform

from .reshard_faults import BATCH_SLOTS, NAME, ROWS, SPEC, STEPS, Trainer, node_rows, stop_at

# a whole move with restarts: bounded by the waits below, longer than the default timeout
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def _moved(helpers: SimpleNamespace, platform: LocalPlatform, shards: int) -> None:
    def done() -> bool:
        status = platform.provisioner.status(NAME)
        moving = {c["type"]: c for c in status.get("conditions", [])}.get("Resharding")
        ready = status.get("phase") == "Ready" and len(status.get("shards", [])) == shards
        return ready and moving is not None and moving.get("reason") == "MoveDone"

    helpers.wait_for(done, 600, f"the move to {shards} shards")


@pytest.mark.parametrize("role", ["source", "target"])
def test_a_node_killed_at_each_step_of_a_move(
    tmp_path: Path, helpers: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    platform = helpers.start_platform(tmp_path / "state", reshard_batch_slots=BATCH_SLOTS)
    killed: list[tuple[int, str, int]] = []

    def kill(step: str, job: ReshardJob) -> None:
        if job.current >= len(STEPS) or step != STEPS[job.current]:
            return
        if any(batch == job.current for batch, _, _ in killed):
            return  # once per batch: the retry runs through
        shard = job.batch.source if role == "source" else job.batch.target
        pid = platform.provisioner.node_pid(NAME, shard)
        killed.append((job.current, step, shard))
        os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(ReshardRun, "_step", stop_at(kill))
    try:
        api = helpers.Api(platform)
        api.create_table(SPEC)
        api.wait_ready(NAME)
        trainer = Trainer(platform.url, platform.token, platform.ps_token, f"kill-{role}")
        api.http.patch(f"/tables/{NAME}", json={"shards": 3}).raise_for_status()
        _moved(helpers, platform, 3)
        assert [step for _, step, _ in killed] == STEPS
        restarts = {s: platform.provisioner.node_restarts(NAME, s) for _, _, s in killed}
        assert sum(restarts.values()) >= len(STEPS), restarts
        trainer.finish()
        assert sum(node_rows(platform.provisioner.endpoints(NAME), platform.ps_token)) == ROWS
        stored = json.loads((tmp_path / "state" / "tables" / NAME / "migration.json").read_text())
        batches = len(stored["job"]["batches"])
        assert batches > len(STEPS)
        epoch = api.table(NAME)["status"]["slotMapEpoch"]
        assert epoch == stored["slot_map"]["epoch"] == 1 + batches  # one commit per batch
        api.http.close()
    finally:
        platform.stop()
