"""A pool resharded on `recstore up` while a trainer runs: 2 -> 3 -> 2 nodes, three tables.

A PATCH of the pool's ``shards`` (and `recstore apply -f` of the changed pool) moves every
table on it online: the new node starts first, each table's slots move with the online
protocol, the node that goes stops only once every table's map left it. A trainer (the
SDK through the admin API, every update carrying a request id) keeps updating the three
tables by unique integer deltas through SGD with lr 1 on zeros tables, so every row must
end as minus the exact sum of its acknowledged deltas. The pool's status shows the
progress (phase Resharding, ``resharding`` with the tables moved); a change while one
moves, and a shrink its tables would not fit, are refused (409) and move nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from recstore import RecStoreClient
from recstore.cli import app
from recstore.core import TableSpec
from recstore.core.pool import PoolSpec
from recstore.core.pool_capacity import budget, footprint
from recstore.local.platform import LocalPlatform

# three tables' moves, twice, on a shared machine: bounded by the waits below
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ROWS, DIM = 3000, 4
TABLES = ("t0", "t1", "t2")
POOL_SPEC = {"shards": 2, "placement": {"resources": {"memory": "400Mi"}}}
POOL = {"name": "model", **POOL_SPEC}


def table(name: str, rows: int = ROWS) -> dict[str, Any]:
    return {
        "name": name, "numEmbeddings": rows, "embeddingDim": DIM, "pool": "model",
        "initializer": {"kind": "zeros"}, "optimizer": {"kind": "sgd", "lr": 1.0},
    }  # fmt: skip


def per_node(rows: int, shards: int) -> int:
    """The bytes one of ``shards`` nodes reserves for a table of ``rows`` rows."""
    declared = {k: v for k, v in table("x", rows).items() if k != "pool"}
    return footprint(TableSpec.model_validate({**declared, "shards": shards}), shards).host


class Trainer:
    """Updates the three tables by unique deltas until stopped, summing what was acked."""

    def __init__(self, platform: LocalPlatform) -> None:
        self.client = RecStoreClient(role="pool-trainer")
        self.client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
        for name in TABLES:
            self.client.init_data(name, (ROWS, DIM), torch.float32)
        self.sums = {name: np.zeros(ROWS, dtype=np.int64) for name in TABLES}
        self.steps = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        rng = np.random.default_rng(5)
        try:
            while not self.stop.is_set():
                delta = self.steps + 1
                for name in TABLES:
                    ids = rng.choice(ROWS, 32, replace=False)
                    self.client.update(
                        name, torch.from_numpy(ids), torch.full((32, DIM), delta * 1.0)
                    )
                    self.client.pull(name, torch.from_numpy(ids[:2]))  # the update is in
                    self.sums[name][ids] += delta
                self.steps += 1
        except BaseException as error:  # reported by the test
            self.error = error

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=120)
        assert self.error is None, self.error
        for name in TABLES:
            got = self.client.pull(name, torch.arange(ROWS)).numpy()
            want = -self.sums[name][:, None].astype(np.float32).repeat(DIM, 1)
            np.testing.assert_array_equal(got, want, err_msg=name)
        self.client.close()


def moved_to(helpers: SimpleNamespace, api: Any, shards: int, phases: set[str]) -> dict[str, Any]:
    """The pool once every table moved to ``shards`` nodes; ``phases`` collects those seen."""

    def done() -> dict[str, Any] | bool:
        pool = api.http.get("/pools/model").json()
        status = pool["status"] or {}
        phases.add(str(status.get("phase")))
        progress = status.get("resharding") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        finished = conditions.get("Resharding", {}).get("reason") == "MoveDone"
        at = progress.get("toShards") == shards and progress.get("tablesMoved") == len(TABLES)
        ready = status.get("phase") == "Ready" and status.get("readyShards") == shards
        return pool if finished and at and ready else False

    return dict(helpers.wait_for(done, 420, f"the pool's move to {shards} nodes"))


def slot_map_shards(api: Any, name: str) -> int:
    """The nodes owning slots of the table in the map discovery hands the SDK."""
    found = api.http.get(f"/tables/{name}/discovery").json()
    return len({shard for _, _, shard in found["slot_map"]["ranges"]})


def test_a_pool_moves_its_tables_two_to_three_and_back_while_training(
    tmp_path: Path, helpers: SimpleNamespace
) -> None:
    platform = helpers.start_platform(tmp_path / "state")
    try:
        api = helpers.Api(platform)
        api.http.post("/pools", json=POOL).raise_for_status()
        for name in TABLES:
            api.create_table(table(name))
        for name in TABLES:
            api.wait_ready(name)
        trainer = Trainer(platform)
        trainer.thread.start()
        helpers.wait_for(lambda: trainer.steps > 3 or trainer.error, 60, "training")

        grow = api.http.patch("/pools/model", json={"shards": 3})
        assert grow.status_code == 200, grow.text
        again = api.http.patch("/pools/model", json={"shards": 4})
        assert again.status_code == 409 and "resharding 2 -> 3" in again.text, again.text
        phases: set[str] = set()
        grown = moved_to(helpers, api, 3, phases)
        assert "Resharding" in phases and "Degraded" not in phases, phases
        assert grown["status"]["resharding"] == {
            "fromShards": 2, "toShards": 3, "tablesMoved": 3, "tablesTotal": 3, "failed": [],
        }  # fmt: skip
        assert {t["name"]: t["shards"] for t in grown["status"]["tables"]} == dict.fromkeys(
            TABLES, 3
        )
        endpoints = platform.provisioner.pool_endpoints("model")
        assert len(endpoints) == 3
        for name in TABLES:
            assert slot_map_shards(api, name) == 3
            assert api.http.get(f"/tables/{name}/discovery").json()["endpoints"] == endpoints
        updates = api.http.get("/events", params={"action": "pool.update"}).json()
        update = updates["items"][0]
        assert (update["before"]["spec"]["shards"], update["after"]["spec"]["shards"]) == (2, 3)

        # a table that fits each of 3 nodes but not each of 2: the shrink is refused
        free = budget(PoolSpec.model_validate(POOL_SPEC)).host - 3 * per_node(ROWS, 3)
        rows = next(r for r in range(100_000, 50_000_000, 100_000) if per_node(r, 3) > free * 0.7)
        assert per_node(rows, 2) > free
        api.create_table(table("big", rows))
        api.wait_ready("big")
        refused = api.http.patch("/pools/model", json={"shards": 2})
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert "shrinking pool 'model' from 3 to 2 nodes is refused" in detail
        assert "table 'big' needs" in detail and "MiB" in detail
        assert api.http.get("/pools/model").json()["spec"]["shards"] == 3  # nothing written
        assert api.http.get("/events", params={"action": "pool.update"}).json() == updates
        assert platform.provisioner.pool_endpoints("model") == endpoints  # nothing moved
        assert all(slot_map_shards(api, name) == 3 for name in (*TABLES, "big"))
        assert api.http.delete("/tables/big").status_code == 204

        manifest = tmp_path / "pool.yaml"
        manifest.write_text(yaml.safe_dump({
            "apiVersion": "recstore.io/v1alpha1", "kind": "EmbeddingPool",
            "metadata": {"name": "model"}, "spec": POOL_SPEC,
        }))  # fmt: skip
        applied = CliRunner().invoke(
            app, ["apply", "-f", str(manifest), "--admin-url", platform.url,
                  "--token", platform.token],
        )  # fmt: skip
        assert applied.exit_code == 0, applied.output
        assert "model configured" in applied.output
        shrunk = moved_to(helpers, api, 2, set())
        assert shrunk["status"]["resharding"]["fromShards"] == 3
        assert len(platform.provisioner.pool_endpoints("model")) == 2
        assert not (tmp_path / "state" / "pools" / "model" / "shard-2").exists()
        assert all(slot_map_shards(api, name) == 2 for name in TABLES)

        trainer.finish()
        assert trainer.steps > 0
        api.http.close()
    finally:
        platform.stop()


def test_a_client_idle_through_a_shrink_finds_its_rows_on_the_nodes_left(
    tmp_path: Path, helpers: SimpleNamespace
) -> None:
    """Its map still names the node the shrink stopped: that node cannot be reached, the
    admin API says it serves the table no more, so the keys go to their new owners."""
    platform = helpers.start_platform(tmp_path / "state")
    try:
        api = helpers.Api(platform)
        api.http.post("/pools", json={**POOL, "shards": 3}).raise_for_status()
        api.create_table(table("t0"))
        api.wait_ready("t0")
        client = RecStoreClient(role="idle-reader")
        client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
        client.init_data("t0", (ROWS, DIM), torch.float32)
        rows = torch.arange(ROWS * DIM, dtype=torch.float32).view(ROWS, DIM)
        client.push("t0", torch.arange(ROWS), rows)
        before = platform.provisioner.pool_endpoints("model")
        assert len(before) == 3

        assert api.http.patch("/pools/model", json={"shards": 2}).status_code == 200
        helpers.wait_for(lambda: len(platform.provisioner.pool_endpoints("model")) == 2, 420,
                         "the shrink")  # fmt: skip
        assert set(platform.provisioner.pool_endpoints("model")) < set(before)
        torch.testing.assert_close(client.pull("t0", torch.arange(ROWS)), rows, atol=0, rtol=0)
        client.close()
    finally:
        platform.stop()
