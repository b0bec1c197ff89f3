"""The local platform resharded online while a trainer runs: 2 -> 3 -> 2 shards.

A PATCH of ``shards`` starts the move; the trainer (SDK through the admin API)
keeps updating by unique integer deltas through SGD with lr 1 on a zeros table,
so every row must end as minus the exact sum of its acknowledged deltas. The
status shows the move (phase Resharding, a Resharding condition with progress)
and `recstore get table` prints it; a second change while one runs is refused.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from recstore import RecStoreClient
from recstore.cli import app

# a whole move with restarts: bounded by the waits below, longer than the default timeout
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ROWS, DIM = 3000, 4
SPEC = {
    "name": "live",
    "numEmbeddings": ROWS,
    "embeddingDim": DIM,
    "shards": 2,
    "initializer": {"kind": "zeros"},
    "optimizer": {"kind": "sgd", "lr": 1.0},
}


class Trainer:
    def __init__(self, url: str, token: str, ps_token: str) -> None:
        self.client = RecStoreClient(role="online-trainer")
        self.client.set_admin_url(url, token, ps_token=ps_token)
        self.client.init_data("live", (ROWS, DIM), torch.float32)
        self.sums = np.zeros(ROWS, dtype=np.int64)
        self.steps = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        rng = np.random.default_rng(3)
        try:
            while not self.stop.is_set():
                ids = rng.choice(ROWS, 64, replace=False)
                delta = self.steps + 1
                self.client.update(
                    "live", torch.from_numpy(ids), torch.full((64, DIM), delta * 1.0)
                )
                self.client.pull("live", torch.from_numpy(ids[:2]))  # the update is in
                self.sums[ids] += delta
                self.steps += 1
        except BaseException as error:  # reported by the test
            self.error = error

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=120)
        assert self.error is None, self.error
        got = self.client.pull("live", torch.arange(ROWS)).numpy()
        want = -self.sums[:, None].astype(np.float32).repeat(DIM, 1)
        np.testing.assert_array_equal(got, want)
        self.client.close()


def _conditions(table: dict[str, object]) -> dict[str, dict[str, str]]:
    status = table["status"]
    assert isinstance(status, dict)
    return {c["type"]: c for c in status["conditions"]}


def _moved_to(
    helpers: SimpleNamespace, api: object, shards: int, phases: set[str] | None = None
) -> dict[str, object]:
    """The table once the move to ``shards`` is done; ``phases`` collects those seen."""

    def done() -> dict[str, object] | bool:
        table = api.table("live")  # type: ignore[attr-defined]
        if phases is not None:
            phases.add(table["status"]["phase"])
        moving = _conditions(table).get("Resharding")
        finished = moving is not None and moving["status"] == "False"
        ready = table["status"]["phase"] == "Ready" and len(table["status"]["shards"]) == shards
        return table if finished and ready and moving["reason"] == "MoveDone" else False

    return dict(helpers.wait_for(done, 420, f"the move to {shards} shards"))


def _patch(api: object, shards: int) -> httpx.Response:
    """PATCH shards; sent again while the status writer won the optimistic-concurrency race."""
    for _ in range(20):
        reply = api.http.patch("/tables/live", json={"shards": shards})  # type: ignore[attr-defined]
        if "changed concurrently" not in reply.text:
            return reply
    return reply


def test_two_to_three_and_back_while_training(tmp_path: Path, helpers: SimpleNamespace) -> None:
    platform = helpers.start_platform(tmp_path / "state")
    try:
        api = helpers.Api(platform)
        api.create_table(SPEC)
        api.wait_ready("live")
        trainer = Trainer(platform.url, platform.token, platform.ps_token)
        trainer.thread.start()

        _patch(api, 3).raise_for_status()
        # the move waits for the new shard's process to start: it is running now
        second = _patch(api, 4)
        assert second.status_code == 409 and "resharding 2 -> 3" in second.text
        phases: set[str] = set()
        grown = _moved_to(helpers, api, 3, phases)
        # the new shard starting owns no slot: the table serves throughout, never Degraded
        assert "Resharding" in phases and "Degraded" not in phases, phases
        message = _conditions(grown)["Resharding"]["message"]
        assert "5461/5461 slots moved" in message and "2 -> 3 shards" in message
        assert grown["status"]["slotMapEpoch"] > 1

        shown = CliRunner().invoke(
            app, ["get", "table", "live", "--admin-url", platform.url, "--token", platform.token]
        )
        assert shown.exit_code == 0, shown.output
        assert "Resharding=False (MoveDone)" in shown.output and "slots moved" in shown.output

        _patch(api, 2).raise_for_status()
        shrunk = _moved_to(helpers, api, 2)
        assert "3 -> 2 shards" in _conditions(shrunk)["Resharding"]["message"]
        assert not (tmp_path / "state" / "tables" / "live" / "shard-2").exists()
        # the catalogue forgot the removed shard's node (its rows no longer count in the table's)
        nodes = api.http.get("/nodes", params={"table": "live"}).json()["items"]
        assert [n["shard_index"] for n in nodes] == [0, 1]
        trainer.finish()
        assert trainer.steps > 0
        api.http.close()
    finally:
        platform.stop()


def test_a_move_stopped_midway_resumes_when_the_platform_starts_again(
    tmp_path: Path, helpers: SimpleNamespace
) -> None:
    state = tmp_path / "state"
    rows = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(9))
    first = helpers.start_platform(state, reshard_batch_slots=64)  # 86 batches
    try:
        api = helpers.Api(first)
        api.create_table(SPEC)
        api.wait_ready("live")
        client = RecStoreClient(role="online-resume")
        client.set_admin_url(first.url, first.token, ps_token=first.ps_token)
        client.init_data("live", (ROWS, DIM), torch.float32)
        client.push("live", torch.arange(ROWS), rows)
        client.close()
        _patch(api, 3).raise_for_status()

        def some_moved() -> bool:
            moving = _conditions(api.table("live")).get("Resharding")
            return moving is not None and " 0/" not in moving["message"]

        helpers.wait_for(some_moved, 120, "a first batch moved")
        api.http.close()
    finally:
        first.stop()  # mid-move: the batch in flight is aborted or, if committed, kept
    stored = json.loads((state / "tables" / "live" / "migration.json").read_text())
    assert stored["job"]["phase"] != "done" and stored["job"]["current"] > 0

    second = helpers.start_platform(state)
    try:
        api = helpers.Api(second)
        _moved_to(helpers, api, 3)
        client = RecStoreClient(role="online-resume-2")
        client.set_admin_url(second.url, second.token, ps_token=second.ps_token)
        client.init_data("live", (ROWS, DIM), torch.float32)
        torch.testing.assert_close(client.pull("live", torch.arange(ROWS)), rows)
        client.close()
        api.http.close()
    finally:
        second.stop()
