"""On-demand checkpoints on Kubernetes, end to end.

The real admin API, its Kubernetes provisioner pointed at the API double (kmock), creates
the table and annotates the EmbeddingTable with each requested checkpoint; the real
operator takes the request, every shard saves under one id, and the outcome reaches the
admin API through the mirrored status, which completes or fails its record. The shards
are real PS nodes on loopback (pod i at 127.0.0.{i+1}), or the recording PS double where a
save must be held while the test acts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
from pydantic import SecretStr

from recstore.admin import Settings, create_app
from recstore.admin.provisioning import KubernetesProvisioner
from recstore.core.checkpoint_status import ShardCheckpoint, TableCheckpoint
from recstore.core.resource import CHECKPOINT_REQUEST_ANNOTATION
from recstore.core.status import TableStatus
from recstore.local.ports import free_port
from recstore.operator.config import OperatorConfig
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.serve.server import ServerHandle, start_in_thread

from .cluster_objects import MERGE, STS, get, run_shards, status_of, table
from .conftest import ET, NS, ApiServer, FakePS, running_operator, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ADMIN = "admin-secret-for-checkpoint-tests"
PROVISIONER = "provisioner-secret-for-checkpoint-tests"
SPEC = {"name": "clicks", "numEmbeddings": 1000, "embeddingDim": 8, "shards": 2}
CHECKPOINTS = "/api/v1/tables/clicks/checkpoints"


def checkpoint(reported: dict[str, Any]) -> TableCheckpoint:
    return TableCheckpoint.model_validate(reported)


def pod_ip(index: int) -> str:
    return f"127.0.0.{index + 1}"


@pytest.fixture
def admin_url(api_server: ApiServer, tmp_path: Path, serve_admin: Any) -> Iterator[str]:
    """The real admin API; its provisioner writes EmbeddingTables into the API double."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'admin.db'}",
        bootstrap_token=SecretStr(ADMIN),
        provisioner_token=SecretStr(PROVISIONER),
    )
    kube = httpx.Client(base_url=str(api_server.url), timeout=10)
    try:
        with serve_admin(create_app(settings, provisioner=KubernetesProvisioner(kube, NS))) as url:
            yield url
    finally:
        kube.close()


@pytest.fixture
async def admin(admin_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=admin_url, headers=headers, timeout=30) as client:
        yield client


def config(admin_url: str, ps_port: int) -> OperatorConfig:
    return OperatorConfig(
        ps_image="registry.example/recstore-ps:1.0",
        ps_token_secret="ps-token",
        admin_url=admin_url,
        provisioner_token=PROVISIONER,
        status_interval=0.2,
        ps_port=ps_port,
        rpc_timeout=5,
        save_timeout=10,
        checkpoint_retries=2,
        retry_delay=0.2,
    )


@contextlib.asynccontextmanager
async def nodes_on_loopback(root: Path, port: int) -> AsyncIterator[list[ServerHandle]]:
    """Real PS nodes, shard i on pod_ip(i):port, each with its own data directory."""
    nodes: list[ServerHandle] = []
    try:
        for index in range(SPEC["shards"]):
            node = await asyncio.to_thread(
                start_in_thread, pod_ip(index), port, data_dir=root / f"node-{index}",
                shard_index=index, num_shards=SPEC["shards"],
            )  # fmt: skip
            nodes.append(node)
        yield nodes
    finally:
        for node in nodes:
            await asyncio.to_thread(node.stop, False)


async def create_ready_table(
    admin: httpx.AsyncClient, api: httpx.AsyncClient, ip: Any = pod_ip
) -> None:
    """The table created through the admin API, its shards run, Ready as the admin API sees it."""
    created = await admin.post("/api/v1/tables", json=SPEC)
    assert created.status_code == 201, created.text
    await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    await run_shards(api, "clicks", SPEC["shards"], ip)

    async def ready() -> bool:
        return (await admin.get("/api/v1/tables/clicks")).json()["status"]["phase"] == "Ready"

    await wait_for(ready, what="Ready in the admin API", timeout=60)


async def request(admin: httpx.AsyncClient) -> int:
    asked = await admin.post(CHECKPOINTS)
    assert asked.status_code == 202, asked.text
    assert asked.json()["state"] == "Requested"
    return int(asked.json()["id"])


async def record_in(admin: httpx.AsyncClient, request_id: int, *states: str) -> dict[str, Any]:
    """Wait until the admin API's record of the request is in one of ``states``."""

    async def record() -> dict[str, Any] | None:
        items = (await admin.get(CHECKPOINTS)).json()["items"]
        found = next(item for item in items if item["id"] == request_id)
        return found if found["state"] in states else None

    result: dict[str, Any] = await wait_for(record, what=f"checkpoint {request_id} {states}")
    return result


async def test_a_requested_checkpoint_completes_with_every_shards_checkpoint_listed(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, admin_url: str, tmp_path: Path
) -> None:
    port = free_port()
    async with (
        nodes_on_loopback(tmp_path, port),
        running_operator(api, config(admin_url, port)),
    ):
        await create_ready_table(admin, api)
        request_id = await request(admin)
        record = await record_in(admin, request_id, "Completed", "Failed")

        assert record["state"] == "Completed", record
        assert record["completed_at"] is not None
        result = record["detail"]["result"]
        checkpoint_id = f"request-{request_id}"
        assert (result["id"], result["requestId"], result["message"]) == (
            checkpoint_id, request_id, None
        )  # fmt: skip
        assert [(s["index"], s["endpoint"], s["error"]) for s in result["shards"]] == [
            (index, f"{pod_ip(index)}:{port}", None) for index in range(SPEC["shards"])
        ]
        # the resource says the same: the request's outcome and the newest checkpoint
        resource = (await api.get(f"{ET}/clicks")).json()
        assert resource["metadata"]["annotations"][CHECKPOINT_REQUEST_ANNOTATION] == str(request_id)
        stored = TableStatus.model_validate(resource["status"])  # (a merge patch drops nulls)
        assert stored.checkpoint_request == stored.last_checkpoint == checkpoint(result)
        served = (await admin.get("/api/v1/tables/clicks")).json()["status"]
        assert served["lastCheckpoint"] == served["checkpointRequest"] == result
    # every node wrote it, under the one id
    for index in range(SPEC["shards"]):
        saved = checkpoint_read.list_checkpoints(tmp_path / f"node-{index}" / "checkpoints")
        assert checkpoint_id in [info.checkpoint_id for info in saved]


async def test_a_shard_that_fails_fails_the_checkpoint_with_its_reason(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, admin_url: str, tmp_path: Path
) -> None:
    port = free_port()
    async with (
        nodes_on_loopback(tmp_path, port) as nodes,
        running_operator(api, config(admin_url, port)),
    ):
        await create_ready_table(admin, api)
        # shard 1's node is gone; its pod is still Ready (the kubelet has not noticed yet)
        await asyncio.to_thread(nodes[1].stop, False)
        request_id = await request(admin)
        record = await record_in(admin, request_id, "Completed", "Failed")

        assert record["state"] == "Failed", record
        result = record["detail"]["result"]
        assert result["message"].startswith(f"shard 1 ({pod_ip(1)}:{port}): UNAVAILABLE")
        first, second = result["shards"]
        assert first["error"] is None and second["error"].startswith("UNAVAILABLE")
        status = TableStatus.model_validate(await status_of(api))
        assert status.checkpoint_request == checkpoint(result)
        assert status.last_checkpoint is None  # no checkpoint of the whole table exists
        # a failed one is finished: the next request is taken (and fails the same way)
        again = await request(admin)
        retried = await record_in(admin, again, "Completed", "Failed")
        assert retried["state"] == "Failed"
        assert retried["detail"]["result"]["id"] == f"request-{again}"


async def test_a_second_request_while_one_runs_is_refused_until_it_is_reported(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, admin_url: str, fake_ps: FakePS
) -> None:
    async with running_operator(api, config(admin_url, fake_ps.port)):
        await create_ready_table(admin, api, lambda index: "127.0.0.1")
        fake_ps.hold_saves = asyncio.Event()
        first = await request(admin)
        await record_in(admin, first, "Running")

        refused = await admin.post(CHECKPOINTS)
        assert refused.status_code == 409
        assert refused.json()["detail"] == (
            f"checkpoint {first} of table 'clicks' is still running (the operator has not "
            "reported it completed or failed); request another once it has"
        )
        listed = (await admin.get(CHECKPOINTS)).json()
        assert [item["id"] for item in listed["items"]] == [first]  # nothing recorded
        events = (await admin.get("/api/v1/events?action=checkpoint.request")).json()
        assert events["total"] == 1

        fake_ps.hold_saves.set()
        await record_in(admin, first, "Completed")
        then = await request(admin)
        assert (await record_in(admin, then, "Completed", "Failed"))["state"] == "Completed"
    assert fake_ps.saves == [f"request-{first}"] * 2 + [f"request-{then}"] * 2


async def _annotate(api: httpx.AsyncClient, request_id: int) -> None:
    patch = {"metadata": {"annotations": {CHECKPOINT_REQUEST_ANNOTATION: str(request_id)}}}
    (await api.patch(f"{ET}/clicks", json=patch, headers=MERGE)).raise_for_status()


async def _request_is(api: httpx.AsyncClient, request_id: int, state: str) -> Any:
    asked = (await status_of(api)).get("checkpointRequest") or {}
    return asked if (asked.get("requestId"), asked.get("state")) == (request_id, state) else None


async def test_an_annotation_replaced_while_one_runs_is_taken_after_it(
    operator: Any, api: httpx.AsyncClient, fake_ps: FakePS
) -> None:
    """The operator takes one request at a time: a request annotated by hand while one runs
    waits until that one's outcome is in the status."""
    (await api.post(ET, json=table())).raise_for_status()
    await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    fake_ps.hold_saves = asyncio.Event()
    await run_shards(api, "clicks", 2)
    await _annotate(api, 5)
    await wait_for(lambda: _request_is(api, 5, "Running"), what="request 5 running")
    await _annotate(api, 6)
    fake_ps.hold_saves.set()

    done = await wait_for(lambda: _request_is(api, 6, "Completed"), what="request 6 completed")
    assert fake_ps.saves == ["request-5"] * 2 + ["request-6"] * 2
    assert checkpoint(done).shards == [
        ShardCheckpoint(index=i, endpoint=f"127.0.0.1:{fake_ps.port}", rows=0, bytes=0)
        for i in range(2)
    ]
    assert (await status_of(api))["lastCheckpoint"] == done


async def test_a_request_running_when_the_table_is_deleted_fails_saying_so(
    operator: Any, api: httpx.AsyncClient, fake_ps: FakePS, admin_server: kmock.RawHandler
) -> None:
    (await api.post(ET, json=table())).raise_for_status()
    await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    fake_ps.hold_saves = asyncio.Event()
    await run_shards(api, "clicks", 2)
    await _annotate(api, 5)
    await wait_for(lambda: _request_is(api, 5, "Running"), what="request 5 running")

    (await api.delete(f"{ET}/clicks")).raise_for_status()
    failed = await wait_for(lambda: _request_is(api, 5, "Failed"), what="request 5 failed")
    assert failed["message"] == (
        "the table is being deleted: its final checkpoint saves the shards instead"
    )
    fake_ps.hold_saves.set()  # the final checkpoint goes ahead

    async def gone() -> bool:
        return await get(api, f"{ET}/clicks") is None

    await wait_for(gone, what="the EmbeddingTable released by the operator")
    assert fake_ps.saves[-1].startswith("final-")
    mirrored = [r.data for r in admin_server if r.method == "PUT" and r.data["phase"] == "Deleting"]
    assert checkpoint(mirrored[-1]["checkpointRequest"]) == checkpoint(failed)
    assert mirrored[-1]["lastCheckpoint"]["id"] == fake_ps.saves[-1]
