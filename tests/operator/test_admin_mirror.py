"""The operator's admin mirror against the real admin API: as the provisioner it registers
each shard's node and writes the status, so discovery serves the endpoints; any other
token is refused."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from pydantic import SecretStr

from recstore.admin import Settings, create_app
from recstore.operator.admin_mirror import AdminMirror
from recstore.operator.config import OperatorConfig

ADMIN = "admin-secret-for-mirror-tests"
PROVISIONER = "provisioner-secret-for-mirror-tests"
LOG = logging.getLogger("test-mirror")


@pytest.fixture
def admin_url(tmp_path: Path) -> Iterator[str]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'admin.db'}",
        bootstrap_token=SecretStr(ADMIN),
        provisioner_token=SecretStr(PROVISIONER),
    )
    app = create_app(settings)
    listening = socket.create_server(("127.0.0.1", 0))  # queued until uvicorn accepts
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listening.getsockname()[1]}"
    spec = {"name": "clicks", "numEmbeddings": 10, "embeddingDim": 4, "shards": 2}
    headers = {"Authorization": f"Bearer {ADMIN}"}
    httpx.post(f"{url}/api/v1/tables", json=spec, headers=headers).raise_for_status()
    yield url
    server.should_exit = True
    thread.join(timeout=10)
    listening.close()
    app.state.context.engine.dispose()


STATUS = {  # the operator's status, every key the mirror sends
    "phase": "Ready",
    "conditions": [],
    "observedGeneration": 1,
    "slotMapEpoch": 1,
    "lastCheckpoint": None,
    "shards": [
        {"index": i, "endpoint": f"clicks-ps-{i}.clicks-ps.ml.svc.cluster.local:50051"}
        for i in range(2)
    ],
}


async def test_the_provisioner_token_registers_nodes_and_writes_status(admin_url: str) -> None:
    mirror = AdminMirror(admin_url, PROVISIONER)
    try:
        assert await mirror.put_status("clicks", STATUS, LOG)
        assert await mirror.put_status("clicks", {**STATUS, "phase": "Degraded"}, LOG)
    finally:
        await mirror.aclose()
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=admin_url, headers=headers) as api:
        found = (await api.get("/api/v1/tables/clicks/discovery")).json()
        nodes = (await api.get("/api/v1/nodes")).json()
        events = (await api.get("/api/v1/events?action=node.register")).json()
    assert found["endpoints"] == [s["endpoint"] for s in STATUS["shards"]]
    assert all(n["provisioned"] for n in nodes["items"])
    assert events["total"] == 2  # registered once each, not again with every status


async def test_an_admin_token_is_refused(admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    mirror = AdminMirror(admin_url, ADMIN)
    try:
        assert not await mirror.put_status("clicks", STATUS, LOG)
    finally:
        await mirror.aclose()
    assert "403" in caplog.text and "provisioner" in caplog.text


def test_the_operator_reads_its_provisioner_token_from_the_environment() -> None:
    env = {"RECSTORE_PROVISIONER_TOKEN": "p", "RECSTORE_ADMIN_TOKEN": "an-admin-token"}
    assert OperatorConfig.from_env(env).provisioner_token == "p"
    assert OperatorConfig.from_env({"RECSTORE_ADMIN_TOKEN": "a"}).provisioner_token is None
