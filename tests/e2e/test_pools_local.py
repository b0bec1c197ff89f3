"""Pools on `recstore up`: one set of node processes that many tables share.

A table placed on a pool starts no process: it is created on each of the pool's nodes.
It waits (Pending, condition Pool) for a pool that does not exist yet and proceeds when
the pool comes; one the nodes have no room for is Failed (condition Capacity, with the
figures) and created nowhere; deleting one drops it from the nodes, whose memory goes
down while the others keep serving; a pool that holds tables is not deleted; pools and
their tables survive a restart; a collection over tables of one pool sends one MultiPull
per node per step.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import recstore.nn as rnn
from recstore import RecStoreClient
from recstore.client.remote.nodes import NodeCalls
from recstore.core import TableSpec
from recstore.core.pool_capacity import engine_bytes
from recstore.local.platform import LocalPlatform
from recstore.local.shard_client import ShardClient
from recstore.ps.checkpoint.read import list_checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

POOL = {"name": "model", "shards": 2, "placement": {"resources": {"memory": "600Mi"}}}
WIDE = {"name": "wide", "numEmbeddings": 1_000_000, "embeddingDim": 16, "pool": "model"}


def condition(table: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in table["status"].get("conditions") or [] if c["type"] == kind)


def node_processes() -> list[int]:
    """The ps-node processes this process started (the platform's nodes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if ppid == os.getpid() and b"ps-node" in argv:
            found.append(int(entry.name))
    return sorted(found)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def trainer(platform: LocalPlatform) -> RecStoreClient:
    client = RecStoreClient(role="pool-test")
    client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
    return client


def test_a_pool_holds_many_tables_on_its_own_nodes(
    platform: LocalPlatform, api: Any, helpers: SimpleNamespace
) -> None:
    early = {"name": "early", "numEmbeddings": 1000, "embeddingDim": 8, "pool": "model"}
    api.create_table(early)
    waiting = helpers.wait_for(
        lambda: (t := api.table("early"))["status"].get("conditions") and t, 30, "early reported"
    )
    assert waiting["status"]["phase"] == "Pending"
    assert condition(waiting, "Pool")["status"] == "False"
    assert "pool 'model' does not exist" in condition(waiting, "Pool")["message"]

    api.http.post("/pools", json=POOL).raise_for_status()
    placed = api.wait_ready("early")
    assert placed["pool"] == "model" and placed["spec"]["shards"] == 2
    assert condition(placed, "Pool")["status"] == "True"
    pool_endpoints = platform.provisioner.pool_endpoints("model")
    discovery = api.http.get("/tables/early/discovery").json()
    assert discovery["endpoints"] == pool_endpoints

    api.create_table(WIDE)
    api.create_table({**WIDE, "name": "huge", "numEmbeddings": 20_000_000})
    api.wait_ready("wide")
    huge = helpers.wait_for(
        lambda: (t := api.table("huge"))["status"].get("phase") == "Failed" and t, 30, "huge"
    )
    capacity = condition(huge, "Capacity")
    assert capacity["status"] == "False" and capacity["reason"] == "Exceeded"
    assert "needs" in capacity["message"] and "MiB" in capacity["message"]
    nodes = [ShardClient(e, token=platform.ps_token) for e in pool_endpoints]
    assert all(node.stats("huge") is None for node in nodes)  # created nowhere
    assert len(node_processes()) == 2  # the pool's nodes, none per table

    held = [TableSpec.model_validate(api.table(name)["spec"]) for name in ("early", "wide")]
    reserved = sum(engine_bytes(spec, 2) for spec in held)
    pool = helpers.wait_for(
        lambda: (p := api.http.get("/pools/model").json())["status"]
        and len(p["status"]["tables"]) == 3 and p["phase"] == "Ready" and p,
        30, "pool status",
    )  # fmt: skip
    assert pool["tables"] == ["early", "huge", "wide"]
    assert pool["status"]["memory"]["reservedBytes"] == reserved
    assert {t["name"]: t["placed"] for t in pool["status"]["tables"]} == {
        "early": True, "huge": False, "wide": True,
    }  # fmt: skip

    refused = api.http.delete("/pools/model")
    assert refused.status_code == 409
    assert "still holds tables early, huge, wide" in refused.json()["detail"]

    client = trainer(platform)
    client.init_data("wide", (WIDE["numEmbeddings"], 16), torch.float32)
    client.init_data("early", (1000, 8), torch.float32)
    ids = torch.arange(WIDE["numEmbeddings"])
    client.push("wide", ids, torch.randn(len(ids), 16))  # every row resident
    kept = torch.randn(1000, 8)
    client.push("early", torch.arange(1000), kept)
    pids = (
        platform.provisioner.pool_node_pid("model", 0),
        platform.provisioner.pool_node_pid("model", 1),
    )
    held_per_node = [node.stats("wide").memory_bytes for node in nodes]  # type: ignore[union-attr]
    assert min(held_per_node) > 30 * 2**20
    before = [rss_bytes(pid) for pid in pids]

    assert api.http.delete("/tables/wide").status_code == 204
    assert all(node.stats("wide") is None for node in nodes)  # dropped from the nodes
    after = [rss_bytes(pid) for pid in pids]
    for node, was, now, held_bytes in zip(nodes, before, after, held_per_node, strict=True):
        assert was - now > held_bytes // 2, (node.endpoint, was, now, held_bytes)
    torch.testing.assert_close(client.pull("early", torch.arange(1000)), kept)  # still serves
    for shard in (0, 1):  # its final checkpoint, of it alone: the nodes hold "early" too
        root = platform.state_dir / "pools" / "model" / f"shard-{shard}" / "checkpoints"
        finals = [i for i in list_checkpoints(root) if i.checkpoint_id.startswith("final-")]
        assert [i.tables for i in finals] == [["wide"]]
    client.close()
    for node in nodes:
        node.close()

    for name in ("early", "huge"):
        assert api.http.delete(f"/tables/{name}").status_code == 204
    assert api.http.delete("/pools/model").status_code == 204
    helpers.wait_for(lambda: not node_processes(), 60, "the pool's nodes stopped")
    assert not (platform.state_dir / "pools" / "model").exists()


def test_pools_and_their_tables_survive_a_restart_and_share_requests(
    tmp_path: Path, helpers: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    platform = helpers.start_platform(state)
    api = helpers.Api(platform)
    try:
        api.http.post("/pools", json=POOL).raise_for_status()
        names = [f"f{i}" for i in range(3)]
        for name in names:
            api.create_table(
                {"name": name, "numEmbeddings": 500, "embeddingDim": 4, "pool": "model",
                 "optimizer": {"kind": "sgd", "lr": 0.1}}
            )  # fmt: skip
        for name in names:
            api.wait_ready(name)
        client = trainer(platform)
        rows = {name: torch.randn(500, 4) for name in names}
        for name in names:
            client.init_data(name, (500, 4), torch.float32)
            client.push(name, torch.arange(500), rows[name])
        client.close()
        pool_endpoints = platform.provisioner.pool_endpoints("model")
    finally:
        api.http.close()
        platform.stop()

    platform = helpers.start_platform(state)
    api = helpers.Api(platform)
    try:
        for name in names:
            assert api.wait_ready(name)["pool"] == "model"
        assert platform.provisioner.pool_endpoints("model") == pool_endpoints
        assert len(node_processes()) == 2
        client = trainer(platform)
        bags = [
            rnn.EmbeddingBag(500, 4, mode="sum", name=name, client=client,
                             optimizer={"kind": "sgd", "lr": 0.1})
            for name in names
        ]  # fmt: skip
        for name, bag in zip(names, bags, strict=True):
            torch.testing.assert_close(bag.read_weights(), rows[name])  # kept over the restart
        collection = rnn.EmbeddingBagCollection(bags)
        calls: Counter[str] = Counter()
        start = NodeCalls.start

        def counting(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
            calls[method] += 1
            return start(self, method, *args, **kwargs)

        monkeypatch.setattr(NodeCalls, "start", counting)
        generator = torch.Generator().manual_seed(3)
        for _ in range(3):
            calls.clear()
            features = [torch.randint(0, 500, (64, 2), generator=generator) for _ in names]
            outputs = collection(features)
            assert calls == {"MultiPull": 2}  # three tables, one request per node of the pool
            sum(out.sum() for out in outputs).backward()  # type: ignore[union-attr]
        client.close()
    finally:
        api.http.close()
        platform.stop()
