"""End to end: a 2-shard table on the local platform, trained through the SDK.

Everything is real: the admin API on SQLite, the local provisioner, PS node
processes on loopback, the SDK discovering shards through the admin API.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import recstore.nn as rnn
from recstore import RecStoreClient
from recstore.core.routing import SlotMap
from recstore.local.platform import LocalPlatform

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROWS, DIM = 2000, 8


def _spec(name: str, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "numEmbeddings": ROWS,
        "embeddingDim": DIM,
        "shards": 2,
        "initializer": {"kind": "uniform", "low": -0.5, "high": 0.5, "seed": 3},
        "optimizer": {"kind": "sgd", "lr": 0.5},
        **extra,
    }


def _client(platform: LocalPlatform, role: str) -> RecStoreClient:
    client = RecStoreClient(role=role)
    client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
    return client


TRUTH = torch.randn(ROWS, generator=torch.Generator().manual_seed(42))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bags of 3 of the first 100 ids, clicked when their hidden scores sum above 0."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 100, (64, 3), generator=g)
    labels = (TRUTH[ids].sum(1) > 0).float()
    return ids.flatten(), torch.arange(0, 192, 3), labels


def _train(bag: rnn.EmbeddingBag, head: torch.nn.Linear, steps: range) -> list[float]:
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    losses = []
    for step in steps:
        ids, offsets, labels = _batch(step)
        optimizer.zero_grad()
        logits = head(bag(ids, offsets)).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def test_training_checkpoint_and_restart(tmp_path: Path, helpers: SimpleNamespace) -> None:
    Api, wait_for = helpers.Api, helpers.wait_for
    state = tmp_path / "state"
    platform = helpers.start_platform(state)
    try:
        api = Api(platform)
        api.create_table(_spec("clicks"))
        ready = api.wait_ready("clicks")
        assert [s["ready"] for s in ready["status"]["shards"]] == [True, True]

        client = _client(platform, "e2e-train")
        client.init_data("clicks", (ROWS, DIM), torch.float32)
        torch.manual_seed(0)
        bag = rnn.EmbeddingBag(ROWS, DIM, mode="sum", name="clicks", client=client)
        head = torch.nn.Linear(DIM, 1)
        losses = _train(bag, head, range(100))
        assert sum(losses[-10:]) / 10 < 0.75 * sum(losses[:10]) / 10, losses

        # Rows went to both shards, and the catalogue shows them.
        nodes = api.http.get("/nodes", params={"table": "clicks"}).json()["items"]
        wait_for(
            lambda: all(n["rows"] > 0 for n in api.http.get("/nodes").json()["items"]),
            what="both shards report rows",
        )
        assert len(nodes) == 2

        record = api.http.post("/tables/clicks/checkpoints").json()
        wait_for(
            lambda: (
                api.http.get("/tables/clicks/checkpoints").json()["items"][0]["state"]
                == "Completed"
            ),
            what="checkpoint completed",
        )
        assert record["state"] == "Requested"
        ids = torch.arange(ROWS)
        before = client.pull("clicks", ids)
        client.close()
    finally:
        platform.stop()  # nodes write a final checkpoint on SIGTERM

    platform = helpers.start_platform(state)  # the catalogue brings the table back
    try:
        Api(platform).wait_ready("clicks")
        client = _client(platform, "e2e-restart")
        client.init_data("clicks", (ROWS, DIM), torch.float32)
        assert torch.equal(client.pull("clicks", ids), before)
        client.close()
    finally:
        platform.stop()


def test_kill9_node_restarts_and_keeps_every_acknowledged_update(
    platform: LocalPlatform, api: Any, helpers: SimpleNamespace
) -> None:
    api.create_table(
        _spec("walled", checkpoint={"durability": "wal"}, initializer={"kind": "zeros"})
    )
    api.wait_ready("walled")
    client = _client(platform, "e2e-wal")
    client.init_data("walled", (ROWS, DIM), torch.float32)
    expected = torch.zeros(ROWS, DIM)
    g = torch.Generator().manual_seed(1)

    def step(ids: torch.Tensor | None = None) -> None:
        ids = torch.randint(0, ROWS, (256,), generator=g) if ids is None else ids
        grads = torch.randn(len(ids), DIM, generator=g)
        client.update("walled", ids, grads)  # acknowledged once this returns
        expected.index_add_(0, ids, grads, alpha=-0.5)

    for _ in range(20):
        step()
    victim = platform.provisioner.node_pid("walled", 0)
    os.kill(victim, signal.SIGKILL)

    # The first update after the kill touches shard 0 only: it may fail, more than
    # once, while the client still writes to the dead node's connection (so nothing
    # applied it); it is retried, as a trainer retries a failed step, and calls to
    # the restarting node wait for it once the client sees the connection is gone.
    shard0 = torch.from_numpy(np.flatnonzero(SlotMap.initial(2).shard_of(np.arange(ROWS)) == 0))
    first = shard0[torch.randint(0, len(shard0), (128,), generator=g)]
    for _ in range(20):
        try:
            step(first)
            break
        except RuntimeError as error:  # sent on the dead node's connection: not applied
            assert "UNAVAILABLE" in str(error), error
    else:
        raise AssertionError("shard 0 did not come back after 20 attempts")
    for _ in range(20):  # training goes on against the restored node
        step()
    assert platform.provisioner.node_pid("walled", 0) != victim
    assert platform.provisioner.node_restarts("walled", 0) == 1
    torch.testing.assert_close(client.pull("walled", torch.arange(ROWS)), expected)
    client.close()
