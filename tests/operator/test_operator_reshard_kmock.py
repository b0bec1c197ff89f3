"""The real operator (kmock API double) resharding a table online: 2 -> 3 and 3 -> 2.

Real PS nodes on loopback stand in for the pods (pod i has podIP 127.0.0.{i+1}, all on one
port, as pods share the container port); the test plays the StatefulSet controller: when
the operator scales up it starts the new node and adds its Ready pod, when it scales down
it removes them. A trainer writes through the SDK all along (unique integer deltas, SGD
with lr 1 on a zeros table), finding the table through an admin API double that serves
the discovery document from the status the operator mirrors; every row must end as
minus the exact sum of its acknowledged deltas. The slot map and the job live in the CR
status; an operator stopped mid-move and started again finishes the move.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import kmock
import kopf
import numpy as np
import pytest
import torch
from kopf.testing import KopfRunner

from recstore.client import RecStoreClient
from recstore.core.routing import SlotMap
from recstore.local.ports import free_port
from recstore.operator.config import OperatorConfig
from recstore.operator.handlers import register
from recstore.ps.serve.server import ServerHandle, start_in_thread

from .cluster_objects import PODS, STS
from .conftest import ET, NS, PS_TOKEN, ApiServer, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROWS, DIM = 2000, 4
SPEC = {
    "name": "live", "numEmbeddings": ROWS, "embeddingDim": DIM, "shards": 2,
    "initializer": {"kind": "zeros"}, "optimizer": {"kind": "sgd", "lr": 1.0},
}  # fmt: skip


class Pods:
    """PS nodes as pods of StatefulSet ``workload`` (a table's, or a pool's): node i listens
    on 127.0.0.{i+1}:port (its pod IP)."""

    def __init__(
        self, root: Path, api: httpx.AsyncClient, port: int, workload: str = "live-ps"
    ) -> None:
        self.root, self.api, self.port, self.workload = root, api, port, workload
        self.nodes: dict[int, ServerHandle] = {}

    def endpoint(self, index: int) -> str:
        return f"127.0.0.{index + 1}:{self.port}"

    async def start(self, index: int) -> None:
        """As the StatefulSet controller would: with the template's arguments."""
        sts = (await self.api.get(f"{STS}/{self.workload}")).json()
        args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
        num_shards = int(args[args.index("--num-shards") + 1])
        self.nodes[index] = await asyncio.to_thread(
            start_in_thread, f"127.0.0.{index + 1}", self.port,
            data_dir=self.root / f"node-{index}", shard_index=index, num_shards=num_shards,
        )  # fmt: skip
        labels = {
            **sts["spec"]["selector"]["matchLabels"], "apps.kubernetes.io/pod-index": str(index)
        }  # fmt: skip
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{self.workload}-{index}", "namespace": NS, "labels": labels,
                         "uid": f"pod-{index}"},
            "status": {"podIP": f"127.0.0.{index + 1}",
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "ps", "restartCount": 0}]},
        }  # fmt: skip
        (await self.api.post(PODS, json=pod)).raise_for_status()

    async def stop(self, index: int) -> None:
        (await self.api.delete(f"{PODS}/{self.workload}-{index}")).raise_for_status()
        node = self.nodes.pop(index)
        await asyncio.to_thread(node.stop)

    def close(self) -> None:
        for node in self.nodes.values():
            node.stop()


class Trainer:
    """Updates random rows of ``tables`` by unique integer deltas through the SDK (each
    update with its request id) until told to stop."""

    def __init__(self, admin_url: str, tables: Sequence[str] = ("live",)) -> None:
        self.client = RecStoreClient(role="operator-reshard-trainer")
        self.client.set_admin_url(admin_url, "trainer-token")
        self.tables = tuple(tables)
        for name in self.tables:
            self.client.init_data(name, (ROWS, DIM), torch.float32)
        self.sums = {name: np.zeros(ROWS, dtype=np.int64) for name in self.tables}
        self.steps = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        rng = np.random.default_rng(5)
        try:
            while not self.stop.is_set() or self.steps < 20:
                delta = self.steps + 1
                for name in self.tables:
                    ids = rng.choice(ROWS, 64, replace=False)
                    self.client.update(
                        name, torch.from_numpy(ids), torch.full((64, DIM), float(delta))
                    )
                    self.client.pull(name, torch.from_numpy(ids[:2]))  # the update is in
                    self.sums[name][ids] += delta
                self.steps += 1
        except BaseException as error:  # the test reports it
            self.error = error

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.to_thread(self.thread.join, 120)
        assert self.error is None, self.error
        try:
            for name in self.tables:
                got = await asyncio.to_thread(self.client.pull, name, torch.arange(ROWS))
                expected = -self.sums[name][:, None].astype(np.float32).repeat(DIM, 1)
                np.testing.assert_array_equal(got.numpy(), expected, err_msg=name)
        finally:
            self.client.close()  # the role's client must not outlive the test


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def operator_config(admin_server: kmock.RawHandler, port: int) -> OperatorConfig:
    return OperatorConfig(
        ps_image="registry.example/recstore-ps:1.0",
        ps_token_secret="ps-token",
        admin_url=str(admin_server.url),
        provisioner_token="provisioner-token",
        status_interval=0.2,
        ps_port=port,
        rpc_timeout=10,
        save_timeout=10,
        checkpoint_retries=2,
        retry_delay=0.2,
    )


class Operator:
    """Starts and stops the real operator (kopf in a thread) against the API double."""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.runner: KopfRunner | None = None

    def start(self) -> None:
        registry = kopf.OperatorRegistry()
        register(registry, self.config)
        self.runner = KopfRunner(["run", "--standalone", "-A"], registry=registry, timeout=60)
        self.runner.__enter__()

    async def stop(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await asyncio.to_thread(runner.__exit__, None, None, None)


@pytest.fixture
async def fleet(
    api_server: ApiServer, api: httpx.AsyncClient, admin_server: kmock.RawHandler,
    operator_config: OperatorConfig, tmp_path: Path, port: int,
) -> AsyncIterator[tuple[Operator, Pods]]:  # fmt: skip
    import base64

    secret = {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ps-token", "namespace": NS},
        "data": {"token": base64.b64encode(PS_TOKEN.encode()).decode()},
    }  # fmt: skip
    (await api.post(f"/api/v1/namespaces/{NS}/secrets", json=secret)).raise_for_status()
    pods = Pods(tmp_path, api, port)

    def discovery() -> dict[str, Any]:
        # the admin API's view: the slot map the operator last mirrored, the pods' endpoints
        puts = [r for r in admin_server if r.method == "PUT" and (r.data or {}).get("slotMap")]
        slot_map = puts[-1].data["slotMap"] if puts else SlotMap.initial(2).to_dict()
        count = max(SlotMap.from_dict(slot_map).num_shards, len(pods.nodes))
        return {
            "spec": SPEC, "endpoints": [pods.endpoint(i) for i in range(count)],
            "slot_map": slot_map,
        }  # fmt: skip

    admin_server["get /api/v1/tables/live/discovery"] << discovery
    operator = Operator(operator_config)
    operator.start()
    try:
        yield operator, pods
    finally:
        await operator.stop()
        pods.close()


async def _body(api: httpx.AsyncClient) -> dict[str, Any]:
    return (await api.get(f"{ET}/live")).json()


async def _replicas(api: httpx.AsyncClient) -> int:
    response = await api.get(f"{STS}/live-ps")
    return int(response.json()["spec"]["replicas"]) if response.status_code == 200 else 0


async def _settle_statefulset(api: httpx.AsyncClient) -> None:
    """The StatefulSet controller's status: every replica on the latest template."""
    sts = (await api.get(f"{STS}/live-ps")).json()
    generation, replicas = sts["metadata"]["generation"], sts["spec"]["replicas"]
    if (sts.get("status") or {}).get("observedGeneration") == generation:
        return
    status = {
        "replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas,
        "observedGeneration": generation, "currentRevision": f"live-ps-{generation}",
        "updateRevision": f"live-ps-{generation}",
    }  # fmt: skip
    headers = {"Content-Type": "application/merge-patch+json"}
    response = await api.patch(f"{STS}/live-ps/status", json={"status": status}, headers=headers)
    response.raise_for_status()


async def _start_table(api: httpx.AsyncClient, pods: Pods) -> None:
    table = {"apiVersion": "recstore.io/v1alpha1", "kind": "EmbeddingTable",
             "metadata": {"name": "live", "namespace": NS}, "spec": SPEC}  # fmt: skip
    (await api.post(ET, json=table)).raise_for_status()
    await wait_for(lambda: _replicas(api), what="StatefulSet")
    for index in range(2):
        await pods.start(index)
    await _settle_statefulset(api)

    async def ready() -> bool:
        return (await _body(api)).get("status", {}).get("phase") == "Ready"

    await wait_for(ready, what="phase Ready", timeout=60)


async def _reshard(api: httpx.AsyncClient, shards: int) -> None:
    patch = {"spec": {"shards": shards}}
    headers = {"Content-Type": "application/merge-patch+json"}
    (await api.patch(f"{ET}/live", json=patch, headers=headers)).raise_for_status()


async def _moved_to(api: httpx.AsyncClient, shards: int) -> dict[str, Any] | None:
    status = (await _body(api)).get("status") or {}
    job = status.get("migrationJob") or {}
    stored = status.get("slotMap")
    done = job.get("phase") == "done" and job.get("to_shards") == shards
    if done and stored and SlotMap.from_dict(stored).num_shards == shards:
        return status
    return None


async def _play_statefulset(api: httpx.AsyncClient, pods: Pods, seen: list[str]) -> None:
    """The StatefulSet controller: start pods up to replicas, remove those above."""
    while True:
        replicas = await _replicas(api)
        for index in range(len(pods.nodes), replicas):
            stored = ((await _body(api)).get("status") or {}).get("slotMap")
            seen.append(f"up {index} at {SlotMap.from_dict(stored).num_shards if stored else 0}")
            await pods.start(index)
        for index in range(replicas, len(pods.nodes)):
            stored = ((await _body(api)).get("status") or {}).get("slotMap")
            seen.append(f"down {index} at {SlotMap.from_dict(stored).num_shards}")
            await pods.stop(index)
        await _settle_statefulset(api)
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _trainer_on_the_live_table(
    api: httpx.AsyncClient, pods: Pods, admin_server: kmock.RawHandler
) -> AsyncIterator[tuple[Trainer, list[str]]]:
    """The table Ready on 2 shards, a trainer writing to it and the StatefulSet controller
    played all along: yields the trainer and the controller's log of pods started and stopped."""
    await _start_table(api, pods)
    trainer = await asyncio.to_thread(Trainer, str(admin_server.url))
    seen: list[str] = []
    controller = asyncio.create_task(_play_statefulset(api, pods, seen))
    try:
        yield trainer, seen
    finally:
        controller.cancel()


async def test_grow_then_shrink_online_with_a_trainer_running(
    fleet: tuple[Operator, Pods], api: httpx.AsyncClient, admin_server: kmock.RawHandler
) -> None:
    _operator, pods = fleet
    async with _trainer_on_the_live_table(api, pods, admin_server) as (trainer, seen):
        phases: set[str] = set()

        async def grown() -> Any:
            phases.add(((await _body(api)).get("status") or {}).get("phase", ""))
            return await _moved_to(api, 3)

        await _reshard(api, 3)
        status = await wait_for(grown, what="moved to 3 shards", timeout=120)
        assert "Resharding" in phases
        assert status["slotMapEpoch"] == SlotMap.from_dict(status["slotMap"]).epoch > 1
        # grown first: the new shard started while the stored map still had 2 shards,
        # sized for 3; the running pods kept their template (no restart)
        assert seen == ["up 2 at 2"]
        sts = (await api.get(f"{STS}/live-ps")).json()
        assert sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 2
        assert pods.nodes[2].server.config.num_shards == 3
        await _reshard(api, 2)
        await wait_for(lambda: _moved_to(api, 2), what="moved back to 2 shards", timeout=120)
        await wait_for(lambda: len(pods.nodes) == 2, what="shard 2 removed")
        # shrunk last: shard 2 was removed once the stored map no longer named it
        assert seen == ["up 2 at 2", "down 2 at 2"]
        await trainer.finish()
    condition = next(
        c for c in (await _body(api))["status"]["conditions"] if c["type"] == "Resharding"
    )
    assert condition["reason"] == "MoveDone" and "3 -> 2 shards" in condition["message"]


async def test_an_operator_restarted_mid_move_finishes_it_from_the_status(
    fleet: tuple[Operator, Pods], api: httpx.AsyncClient, admin_server: kmock.RawHandler
) -> None:
    operator, pods = fleet
    async with _trainer_on_the_live_table(api, pods, admin_server) as (trainer, seen):
        await _reshard(api, 3)

        async def part_moved() -> Any:
            job = ((await _body(api)).get("status") or {}).get("migrationJob") or {}
            return job.get("current", 0) >= 1 and job.get("phase") != "done"

        await wait_for(part_moved, what="a first batch committed", timeout=120)
        await operator.stop()  # mid-move: the job record stays in the status
        stopped = ((await _body(api)).get("status") or {}).get("migrationJob") or {}
        assert stopped.get("phase") != "done"
        operator.start()
        status = await wait_for(lambda: _moved_to(api, 3), what="the move finished", timeout=120)
        assert SlotMap.from_dict(status["slotMap"]).epoch == 1 + len(
            status["migrationJob"]["batches"]
        )
        await trainer.finish()
    assert seen == ["up 2 at 2"]
