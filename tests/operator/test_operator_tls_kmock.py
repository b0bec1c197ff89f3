"""The real operator (kmock API double) with the hardened settings: its shards serve mutual
TLS, only allowed images run, the admin API sees the operator's own token, and a shard the
scheduler cannot place fails the table with the scheduler's message.

``fake_ps`` and ``operator_config`` are overridden here: the PS double listens with the test
run's server certificate and requires client certificates; the operator dials it by IP and
verifies it by the shared PS server name, as it does with real pods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import kmock
import pytest

from recstore.core.tls import ClientTls, ServerTls
from recstore.operator.config import OperatorConfig
from recstore.v1 import ps_pb2_grpc

from .cluster_objects import PODS, STS, condition, get, status_of, table
from .conftest import ET, NS, ApiServer, FakePS, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DEFAULT_IMAGE = "registry.example/recstore-ps:1.0"


@pytest.fixture
async def fake_ps(tls_files) -> AsyncIterator[FakePS]:
    ps = FakePS()
    server = grpc.aio.server()
    ps_pb2_grpc.add_ParameterServerServicer_to_server(ps, server)
    tls = ServerTls(tls_files.server_cert, tls_files.server_key, client_ca=tls_files.ca)
    ps.port = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
    await server.start()
    yield ps
    await server.stop(None)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "operator-token"
    path.write_text("operator-own-token\n")
    return path


@pytest.fixture
def operator_config(
    fake_ps: FakePS, admin_server: kmock.RawHandler, tls_files, token_file: Path
) -> OperatorConfig:
    return OperatorConfig(
        ps_image=DEFAULT_IMAGE,
        ps_token_secret="ps-token",
        admin_url=str(admin_server.url),
        provisioner_token_file=token_file,
        allowed_images=("registry.example/approved/*",),
        ps_tls_secret="recstore-tls",
        ps_tls_mutual=True,
        tls=ClientTls(
            tls_files.ca, tls_files.client_cert, tls_files.client_key, tls_files.server_name
        ),
        status_interval=0.2,
        ps_port=fake_ps.port,
        rpc_timeout=5,
        save_timeout=5,
        checkpoint_retries=2,
        retry_delay=0.2,
    )


async def _pod(api: httpx.AsyncClient, name: str, index: int, status: dict[str, Any]) -> None:
    sts = await get(api, f"{STS}/{name}-ps")
    assert sts is not None
    labels = {**sts["spec"]["selector"]["matchLabels"], "apps.kubernetes.io/pod-index": str(index)}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-ps-{index}", "namespace": NS, "labels": labels},
        "status": status,
    }
    (await api.post(PODS, json=pod)).raise_for_status()


READY = {
    "podIP": "127.0.0.1",
    "conditions": [{"type": "Ready", "status": "True"}],
    "containerStatuses": [{"name": "ps", "restartCount": 0}],
}


async def test_tables_are_created_over_mutual_tls_on_pods_serving_the_secret(
    operator: Any, api: httpx.AsyncClient, fake_ps: FakePS
) -> None:
    (await api.post(ET, json=table())).raise_for_status()
    sts = await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert {"name": "tls", "secret": {"secretName": "recstore-tls", "items": [
        {"key": k, "path": k} for k in ("tls.crt", "tls.key", "ca.crt")
    ]}} in pod["volumes"]  # fmt: skip
    assert "--tls-client-ca" in pod["containers"][0]["args"]
    for index in range(2):
        await _pod(api, "clicks", index, READY)
    await wait_for(lambda: len(fake_ps.created) == 2, what="CreateTable on both shards over TLS")


async def test_a_disallowed_image_fails_the_table_and_starts_nothing(
    operator: Any, api: httpx.AsyncClient, api_server: ApiServer
) -> None:
    image = "evil.example/miner:latest"
    (await api.post(ET, json=table(placement={"image": image}))).raise_for_status()

    async def failed() -> Any:
        status = await status_of(api)
        return status if status.get("phase") == "Failed" else None

    status = await wait_for(failed, what="phase Failed")
    spec_valid = condition(status, "SpecValid")
    assert spec_valid["status"] == "False"
    assert f"spec.placement.image {image!r} is not allowed" in spec_valid["message"]
    assert (await api.get(STS)).json()["items"] == []
    assert len(api_server[kmock.action.CREATE, kmock.resource("apps/v1/statefulsets")]) == 0


async def test_an_allowed_image_runs(operator: Any, api: httpx.AsyncClient) -> None:
    image = "registry.example/approved/recstore-ps:2.0"
    (await api.post(ET, json=table(placement={"image": image}))).raise_for_status()
    sts = await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == image


async def test_the_admin_api_sees_the_operators_own_token_even_rotated(
    operator: Any, api: httpx.AsyncClient, admin_server: kmock.RawHandler, token_file: Path
) -> None:
    (await api.post(ET, json=table())).raise_for_status()

    def put_with(token: str) -> bool:
        return any(
            r.method == "PUT" and r.headers.get("Authorization") == f"Bearer {token}"
            for r in admin_server
        )

    await wait_for(lambda: put_with("operator-own-token"), what="a status PUT with the token")
    token_file.write_text("rotated-token")  # e.g. the Secret updated in place
    await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    await _pod(api, "clicks", 0, READY)  # a status change: the next PUT
    await wait_for(lambda: put_with("rotated-token"), what="a status PUT with the new token")


async def test_an_unschedulable_shard_fails_the_table_with_the_schedulers_message(
    operator: Any, api: httpx.AsyncClient
) -> None:
    (await api.post(ET, json=table())).raise_for_status()
    await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    unschedulable = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": message},
        ],
    }  # fmt: skip
    await _pod(api, "clicks", 0, READY)
    await _pod(api, "clicks", 1, unschedulable)

    async def failed() -> Any:
        status = await status_of(api)
        return status if status.get("phase") == "Failed" else None

    status = await wait_for(failed, what="phase Failed with the scheduler's message")
    ready = condition(status, "Ready")
    assert ready["reason"] == "NodeRefused"
    assert ready["message"] == f"shard 1 cannot be scheduled: {message}"
