"""The operator's control of online moves (kmock API double, real PS nodes on loopback).

Each moment of a move is a Kubernetes Event on the EmbeddingTable (kopf's event API, read
from the requests the API double recorded) and an audit event posted to the admin API. A
second ``shards`` change while a move runs is queued: a ``ReshardQueued`` condition and
Event, then it starts when the running move ends (with the periodic status refresh off,
so only the move's end can start it). A failed move is retried after a doubling wait, and
the status and the Events say which attempt it is and why the last one stopped.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import kmock
import pytest

from recstore.core.control import ControlClient
from recstore.core.reshard.protocol import ReshardFailed, ReshardRun
from recstore.core.spec import TableSpec
from recstore.operator.config import OperatorConfig

from .cluster_objects import STS
from .conftest import ET, NS, ApiServer, wait_for
from .test_operator_reshard_kmock import (  # noqa: F401 (fleet and port are fixtures)
    SPEC,
    Operator,
    Pods,
    _body,
    _moved_to,
    _play_statefulset,
    _reshard,
    _settle_statefulset,
    _start_table,
    fleet,
    port,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]


@pytest.fixture
def status_interval() -> float:
    return 0.2


@pytest.fixture
def operator_config(
    admin_server: kmock.RawHandler,
    port: int,  # noqa: F811 (the imported fixture)
    status_interval: float,
) -> OperatorConfig:
    return OperatorConfig(
        ps_image="registry.example/recstore-ps:1.0", ps_token_secret="ps-token",
        admin_url=str(admin_server.url), provisioner_token="provisioner-token",
        status_interval=status_interval, ps_port=port, rpc_timeout=10, save_timeout=10,
        checkpoint_retries=2, retry_delay=0.2,
        reshard_attempts=3, reshard_retry_delay=0.05, reshard_retry_cap=0.1,
        reshard_batch_slots=4096,  # a few batches: each costs many API calls
    )  # fmt: skip


def _k8s_events(api_server: ApiServer) -> list[dict[str, Any]]:
    """The Events the operator posted about the table, oldest first."""
    return [
        r.data for r in api_server
        if r.method == "POST" and isinstance(r.data, dict)
        and (r.data.get("involvedObject") or {}).get("name") == "live"
        and str(r.data.get("reason", "")).startswith("Reshard")
    ]  # fmt: skip


def _audit(admin_server: kmock.RawHandler) -> list[dict[str, Any]]:
    """The moments posted to the admin API's audit log, oldest first."""
    return [
        r.data for r in admin_server
        if r.method == "POST" and str(r.url).endswith("/api/v1/tables/live/resharding-events")
    ]  # fmt: skip


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


async def _pods_serving_two_shards(api: httpx.AsyncClient, pods: Pods) -> None:
    """The table on two pods that already hold it (as an earlier refresh made them)."""
    table = {"apiVersion": "recstore.io/v1alpha1", "kind": "EmbeddingTable",
             "metadata": {"name": "live", "namespace": NS}, "spec": SPEC}  # fmt: skip
    (await api.post(ET, json=table)).raise_for_status()

    async def created() -> bool:
        return (await api.get(f"{STS}/live-ps")).status_code == 200

    await wait_for(created, what="StatefulSet")
    spec = TableSpec.model_validate(SPEC)
    for index in range(2):
        await pods.start(index)
        with ControlClient(pods.endpoint(index)) as client:
            await asyncio.to_thread(client.create_table, spec)
    await _settle_statefulset(api)


@pytest.mark.parametrize("status_interval", [3600.0])
async def test_a_change_during_a_move_is_queued_and_starts_when_the_move_ends(
    fleet: tuple[Operator, Pods],  # noqa: F811
    api: httpx.AsyncClient,
    api_server: ApiServer,
    admin_server: kmock.RawHandler,
) -> None:
    _operator, pods = fleet
    await _pods_serving_two_shards(api, pods)
    await _reshard(api, 3)

    async def growing() -> bool:  # the move waits for shard 2, which no one starts yet
        return (await api.get(f"{STS}/live-ps")).json()["spec"]["replicas"] == 3

    await wait_for(growing, what="the StatefulSet scaled to 3")
    await _reshard(api, 4)

    async def queued() -> dict[str, Any] | None:
        condition = _condition((await _body(api)).get("status") or {}, "ReshardQueued")
        return condition if condition and condition["status"] == "True" else None

    condition = await wait_for(queued, what="the ReshardQueued condition")
    assert condition["reason"] == "ShardCountQueued"
    assert "spec.shards is 4 while the move to 3 shards runs" in condition["message"]
    reasons = [e["reason"] for e in _k8s_events(api_server)]
    assert reasons == ["ReshardStarted", "ReshardQueued"]

    seen: list[str] = []
    controller = asyncio.create_task(_play_statefulset(api, pods, seen))
    try:
        status = await wait_for(lambda: _moved_to(api, 4), what="moved on to 4", timeout=240)
    finally:
        controller.cancel()
    assert seen == ["up 2 at 2", "up 3 at 3"]  # each new shard started before its move

    def both_finished() -> bool:  # the last moment is recorded after the status is stored
        reasons = [e["reason"] for e in _k8s_events(api_server)]
        return reasons.count("ReshardFinished") == 2 and _audit(admin_server)[-1]["moment"] == (
            "finished"
        )

    await wait_for(both_finished, what="the second move's ReshardFinished")
    events = _k8s_events(api_server)
    done = [(e["reason"], e["message"]) for e in events if e["reason"] != "ReshardBatchCommitted"]
    assert [r for r, _ in done] == [
        "ReshardStarted",
        "ReshardQueued",
        "ReshardFinished",
        "ReshardStarted",
        "ReshardFinished",
    ]
    assert "2 -> 3 shards finished" in done[2][1] and "3 -> 4 shards started" in done[3][1]
    assert all(e["type"] == "Normal" for e in events)
    assert events[0]["involvedObject"]["kind"] == "EmbeddingTable"
    audit = _audit(admin_server)
    assert [a["moment"] for a in audit if a["moment"] != "batch_committed"] == [
        "started",
        "queued",
        "finished",
        "started",
        "finished",
    ]
    committed = [e for e in events if e["reason"] == "ReshardBatchCommitted"]
    assert sum(a["moment"] == "batch_committed" for a in audit) == len(committed)
    last = [e for e in committed if "3 -> 4 shards" in e["message"]]
    assert len(last) == len(status["migrationJob"]["batches"])

    async def queue_emptied() -> bool:
        condition = _condition((await _body(api)).get("status") or {}, "ReshardQueued")
        return condition is not None and condition["status"] == "False"

    await wait_for(queue_emptied, what="the queue emptied in the status")


async def test_a_failed_move_is_retried_and_says_which_attempt(
    fleet: tuple[Operator, Pods],  # noqa: F811
    api: httpx.AsyncClient,
    api_server: ApiServer,
    admin_server: kmock.RawHandler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _operator, pods = fleet
    await _start_table(api, pods)
    copy = ReshardRun._copy
    failures = [1]

    def flaky(self: ReshardRun, *args: Any) -> int:
        if failures[0]:
            failures[0] -= 1
            raise ReshardFailed("injected: the snapshot stream broke")
        return copy(self, *args)

    monkeypatch.setattr(ReshardRun, "_copy", flaky)
    seen: list[str] = []
    controller = asyncio.create_task(_play_statefulset(api, pods, seen))
    try:
        await _reshard(api, 3)
        status = await wait_for(lambda: _moved_to(api, 3), what="moved to 3", timeout=240)
    finally:
        controller.cancel()

    def finished() -> bool:  # the last moment is recorded after the status is stored
        return [e["reason"] for e in _k8s_events(api_server)][-1:] == ["ReshardFinished"]

    await wait_for(finished, what="ReshardFinished")
    events = [e for e in _k8s_events(api_server) if e["reason"] != "ReshardBatchCommitted"]
    assert [e["reason"] for e in events] == [
        "ReshardStarted",
        "ReshardAborted",
        "ReshardResumed",
        "ReshardFinished",
    ]
    aborted = events[1]
    assert aborted["type"] == "Warning"
    assert "injected: the snapshot stream broke; retrying in 0.05 s" in aborted["message"]
    assert "(attempt 2)" in events[2]["message"] and "(attempt 2)" in events[3]["message"]
    audit = [a for a in _audit(admin_server) if a["moment"] == "aborted"]
    assert len(audit) == 1 and audit[0]["attempt"] == 1 and audit[0]["retry_in_s"] == 0.05

    async def done_shown() -> dict[str, Any] | None:
        condition = _condition((await _body(api)).get("status") or {}, "Resharding")
        return condition if condition and condition["reason"] == "MoveDone" else None

    condition = await wait_for(done_shown, what="the Resharding condition says done")
    assert "(attempt 2)" in condition["message"]
    assert status["slotMapEpoch"] == 1 + len(status["migrationJob"]["batches"])


async def test_a_move_failing_every_attempt_stops_retrying_and_says_so(
    fleet: tuple[Operator, Pods],  # noqa: F811
    api: httpx.AsyncClient,
    api_server: ApiServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _operator, pods = fleet
    await _start_table(api, pods)
    tries: list[int] = []

    def broken(self: ReshardRun, *args: Any) -> int:
        tries.append(1)
        raise ReshardFailed("injected: the target is full")

    monkeypatch.setattr(ReshardRun, "_copy", broken)
    controller = asyncio.create_task(_play_statefulset(api, pods, []))
    try:
        await _reshard(api, 3)

        async def gave_up() -> dict[str, Any] | None:
            condition = _condition((await _body(api)).get("status") or {}, "Resharding")
            last = condition and "no more retries" in condition["message"]
            return condition if last else None

        condition = await wait_for(gave_up, what="the last attempt failed", timeout=240)
    finally:
        controller.cancel()
    assert condition["reason"] == "MoveFailed" and "(attempt 3)" in condition["message"]
    assert "injected: the target is full" in condition["message"]
    assert len(tries) == 3  # the first and two retries (reshard_attempts=3)
    aborted = [e for e in _k8s_events(api_server) if e["reason"] == "ReshardAborted"]
    assert len(aborted) == 3 and "retrying" not in aborted[-1]["message"]
    status = (await _body(api))["status"]
    assert status["migrationJob"]["phase"] != "done"  # the source stayed authoritative
