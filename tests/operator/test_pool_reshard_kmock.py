"""The real operator (kmock API double) resharding an EmbeddingPool online: 2 -> 3 -> 2.

Real PS nodes on loopback are the pool's pods (``Pods`` of the table reshard tests, pod i
at 127.0.0.{i+1}); the test plays the StatefulSet controller. A trainer updates three
tables of the pool through the SDK all along (each update with its request id); every row
must end as minus the exact sum of its acknowledged deltas. The pool grows first (its new
node owns no slot of any table until that table's move gives it some), each table moves
with the online protocol, and the pool shrinks only once no table's stored map names the
node that goes. One table's move failing (a fault injected into its copy) rolls back that
table alone: the others move, the pool keeps the node the failed one still uses, and its
status names it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest

from recstore.core.reshard.protocol import ReshardFailed, ReshardRun
from recstore.core.resource import API_VERSION, POOL_KIND, pool_collection_path
from recstore.core.routing import SlotMap
from recstore.operator.config import OperatorConfig

from .cluster_objects import MERGE, STS
from .conftest import ET, NS, PS_TOKEN, ApiServer, wait_for
from .test_operator_reshard_kmock import DIM, ROWS, Operator, Pods, Trainer, port  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

EP = pool_collection_path(NS)
TABLES = ("a", "b", "c")
WORKLOAD = "model-pool"


def _table_spec(name: str) -> dict[str, Any]:
    return {"name": name, "numEmbeddings": ROWS, "embeddingDim": DIM,
            "initializer": {"kind": "zeros"}, "optimizer": {"kind": "sgd", "lr": 1.0}}  # fmt: skip


@pytest.fixture
def operator_config(admin_server: kmock.RawHandler, port: int) -> OperatorConfig:  # noqa: F811
    return OperatorConfig(
        ps_image="registry.example/recstore-ps:1.0", ps_token_secret="ps-token",
        admin_url=str(admin_server.url), provisioner_token="provisioner-token",
        status_interval=0.2, ps_port=port, rpc_timeout=10, save_timeout=10,
        checkpoint_retries=2, retry_delay=0.2,
        reshard_attempts=2, reshard_retry_delay=0.05, reshard_retry_cap=0.1,
        reshard_batch_slots=4096,  # a few batches a table: each costs many API calls
    )  # fmt: skip


@pytest.fixture
async def pool_pods(
    api_server: ApiServer, api: httpx.AsyncClient, admin_server: kmock.RawHandler,
    operator_config: OperatorConfig, tmp_path: Path, port: int,  # noqa: F811
) -> AsyncIterator[Pods]:  # fmt: skip
    secret = {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ps-token", "namespace": NS},
        "data": {"token": base64.b64encode(PS_TOKEN.encode()).decode()},
    }  # fmt: skip
    (await api.post(f"/api/v1/namespaces/{NS}/secrets", json=secret)).raise_for_status()
    pods = Pods(tmp_path, api, port, workload=WORKLOAD)

    def discovery(name: str) -> Any:
        def document() -> dict[str, Any]:
            # the admin API's view: the slot map the operator last mirrored, the pods
            puts = [
                r for r in admin_server
                if r.method == "PUT" and str(r.url).endswith(f"/tables/{name}/status")
                and (r.data or {}).get("slotMap")
            ]  # fmt: skip
            slot_map = puts[-1].data["slotMap"] if puts else SlotMap.initial(2).to_dict()
            count = max(SlotMap.from_dict(slot_map).num_shards, len(pods.nodes))
            return {"spec": {**_table_spec(name), "shards": 2}, "slot_map": slot_map,
                    "endpoints": [pods.endpoint(i) for i in range(count)]}  # fmt: skip

        return document

    for name in TABLES:
        admin_server[f"get /api/v1/tables/{name}/discovery"] << discovery(name)
    operator = Operator(operator_config)
    operator.start()
    try:
        yield pods
    finally:
        await operator.stop()
        pods.close()


async def _get(api: httpx.AsyncClient, url: str) -> dict[str, Any]:
    response = await api.get(url)
    return response.json() if response.status_code == 200 else {}


async def _maps(api: httpx.AsyncClient) -> list[int]:
    """Each table's stored slot map's shard count (0: none stored yet)."""
    counts = []
    for name in TABLES:
        stored = ((await _get(api, f"{ET}/{name}")).get("status") or {}).get("slotMap")
        counts.append(SlotMap.from_dict(stored).num_shards if stored else 0)
    return counts


async def _settle(api: httpx.AsyncClient) -> None:
    sts = await _get(api, f"{STS}/{WORKLOAD}")
    generation, replicas = sts["metadata"]["generation"], sts["spec"]["replicas"]
    if (sts.get("status") or {}).get("observedGeneration") == generation:
        return
    status = {
        "replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas,
        "observedGeneration": generation, "currentRevision": f"{WORKLOAD}-{generation}",
        "updateRevision": f"{WORKLOAD}-{generation}",
    }  # fmt: skip
    url = f"{STS}/{WORKLOAD}/status"
    (await api.patch(url, json={"status": status}, headers=MERGE)).raise_for_status()


async def _play_statefulset(api: httpx.AsyncClient, pods: Pods, seen: list[str]) -> None:
    """The StatefulSet controller: start pods up to replicas, remove those above; ``seen``
    logs each with the tables' stored map counts at that moment."""
    while True:
        sts = await _get(api, f"{STS}/{WORKLOAD}")
        if not sts:  # the operator has not created it yet
            await asyncio.sleep(0.05)
            continue
        replicas = int(sts["spec"]["replicas"])
        for index in range(len(pods.nodes), replicas):
            seen.append(f"up {index} at {await _maps(api)}")
            await pods.start(index)
        for index in range(replicas, len(pods.nodes)):
            seen.append(f"down {index} at {await _maps(api)}")
            await pods.stop(index)
        await _settle(api)
        await asyncio.sleep(0.05)


async def _set_shards(api: httpx.AsyncClient, shards: int) -> None:
    patch = {"spec": {"shards": shards}}
    (await api.patch(f"{EP}/model", json=patch, headers=MERGE)).raise_for_status()


@contextlib.asynccontextmanager
async def _pool_with_a_trainer(
    api: httpx.AsyncClient, pods: Pods, admin_server: kmock.RawHandler, shards: int
) -> AsyncIterator[tuple[Trainer, list[str]]]:
    """The pool on ``shards`` nodes, its three tables Ready on them, a trainer writing to
    all three and the StatefulSet controller played all along."""
    pool = {"apiVersion": API_VERSION, "kind": POOL_KIND, "metadata": {"name": "model",
            "namespace": NS}, "spec": {"shards": shards,
            "placement": {"resources": {"memory": "1Gi"}}}}  # fmt: skip
    (await api.post(EP, json=pool)).raise_for_status()
    seen: list[str] = []
    controller = asyncio.create_task(_play_statefulset(api, pods, seen))
    try:
        await wait_for(lambda: len(pods.nodes) == shards, what="the pool's pods", timeout=60)
        for name in TABLES:
            body = {"apiVersion": API_VERSION, "kind": "EmbeddingTable",
                    "metadata": {"name": name, "namespace": NS},
                    "spec": {**_table_spec(name), "pool": "model"}}  # fmt: skip
            (await api.post(ET, json=body)).raise_for_status()
        for name in TABLES:

            async def ready(n: str = name) -> bool:
                return ((await _get(api, f"{ET}/{n}")).get("status") or {}).get("phase") == "Ready"

            await wait_for(ready, what=f"{name} Ready", timeout=60)
        assert await _maps(api) == [shards] * 3  # stored at creation: where a move starts
        seen.clear()
        trainer = await asyncio.to_thread(Trainer, str(admin_server.url), TABLES)
        yield trainer, seen
    finally:
        controller.cancel()


async def _pool_moved(api: httpx.AsyncClient, shards: int, moved: int) -> dict[str, Any] | None:
    status = (await _get(api, f"{EP}/model")).get("status") or {}
    progress = status.get("resharding") or {}
    condition = next((c for c in status.get("conditions", []) if c["type"] == "Resharding"), {})
    ended = condition.get("status") == "False" and condition.get("reason") != "MovingTables"
    if progress.get("toShards") == shards and progress.get("tablesMoved") == moved and ended:
        return status
    return None


async def _jobs_done(api: httpx.AsyncClient, names: Sequence[str], shards: int) -> bool:
    for name in names:
        job = ((await _get(api, f"{ET}/{name}")).get("status") or {}).get("migrationJob") or {}
        if job.get("phase") != "done" or job.get("to_shards") != shards:
            return False
    return True


async def test_a_pool_grows_and_shrinks_online_with_a_trainer_on_three_tables(
    pool_pods: Pods, api: httpx.AsyncClient, admin_server: kmock.RawHandler
) -> None:
    pods = pool_pods
    async with _pool_with_a_trainer(api, pods, admin_server, 2) as (trainer, seen):
        phases: set[str] = set()

        async def grown() -> Any:
            phases.add(((await _get(api, f"{EP}/model")).get("status") or {}).get("phase", ""))
            return await _pool_moved(api, 3, 3)

        await _set_shards(api, 3)
        status = await wait_for(grown, what="the pool moved to 3", timeout=300)
        assert "Resharding" in phases
        assert status["resharding"] == {
            "fromShards": 2, "toShards": 3, "tablesMoved": 3, "tablesTotal": 3, "failed": []
        }  # fmt: skip
        condition = next(c for c in status["conditions"] if c["type"] == "Resharding")
        assert condition["reason"] == "MoveDone" and "2 -> 3 shards: 3/3" in condition["message"]
        assert await _maps(api) == [3, 3, 3] and await _jobs_done(api, TABLES, 3)
        # grown first: the new node started while every table's map had 2 shards
        assert seen == ["up 2 at [2, 2, 2]"]

        await _set_shards(api, 2)
        await wait_for(lambda: _pool_moved(api, 2, 3), what="the pool moved to 2", timeout=300)
        await wait_for(lambda: len(pods.nodes) == 2, what="node 2 removed")
        # shrunk last: node 2 went once no table's stored map named it
        assert seen == ["up 2 at [2, 2, 2]", "down 2 at [2, 2, 2]"]
        assert await _jobs_done(api, TABLES, 2)
        await trainer.finish()

    async def settled() -> dict[str, Any] | None:  # the removed pod's status has gone too
        pool: dict[str, Any] = (await _get(api, f"{EP}/model"))["status"]
        return pool if pool["phase"] == "Ready" else None

    pool = await wait_for(settled, what="the pool Ready on 2 nodes")
    assert pool["resharding"]["fromShards"] == 3 and pool["readyShards"] == 2
    assert [t["shards"] for t in pool["tables"]] == [2, 2, 2]


async def test_one_tables_failed_move_rolls_back_that_table_only(
    pool_pods: Pods,
    api: httpx.AsyncClient,
    admin_server: kmock.RawHandler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods = pool_pods
    copy = ReshardRun._copy

    def broken_for_b(self: ReshardRun, *args: Any) -> int:
        if self.table == "b":
            raise ReshardFailed("injected: b's snapshot stream broke")
        return copy(self, *args)

    monkeypatch.setattr(ReshardRun, "_copy", broken_for_b)
    async with _pool_with_a_trainer(api, pods, admin_server, 3) as (trainer, seen):
        epoch_b = SlotMap.from_dict((await _get(api, f"{ET}/b"))["status"]["slotMap"]).epoch
        await _set_shards(api, 2)
        status = await wait_for(lambda: _pool_moved(api, 2, 2), what="a and c moved", timeout=300)
        assert status["resharding"]["failed"] == ["b"] and status["resharding"]["tablesTotal"] == 3
        condition = next(c for c in status["conditions"] if c["type"] == "Resharding")
        assert condition["reason"] == "MoveFailed"
        assert "b: " in condition["message"] and "injected: b's snapshot" in condition["message"]
        assert await _maps(api) == [2, 3, 2] and await _jobs_done(api, ("a", "c"), 2)
        b = (await _get(api, f"{ET}/b"))["status"]
        assert SlotMap.from_dict(b["slotMap"]).epoch == epoch_b  # rolled back: nothing moved
        reason = next(c for c in b["conditions"] if c["type"] == "Resharding")["reason"]
        assert reason == "MoveFailed"
        # b still uses node 2: the pool keeps it
        assert (await _get(api, f"{STS}/{WORKLOAD}"))["spec"]["replicas"] == 3
        assert seen == [] and len(pods.nodes) == 3
        await trainer.finish()
