"""The operator's admin mirror against the real admin API: as the provisioner it registers
each shard's node and writes the status, so discovery serves the endpoints; any other
token is refused."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from recstore.admin import Settings, create_app
from recstore.core.status import ShardStatus, TableStatus
from recstore.operator.admin_mirror import AdminMirror
from recstore.operator.config import OperatorConfig

ADMIN = "admin-secret-for-mirror-tests"
PROVISIONER = "provisioner-secret-for-mirror-tests"
LOG = logging.getLogger("test-mirror")


@pytest.fixture
def admin_url(tmp_path: Path, serve_admin: Any) -> Iterator[str]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'admin.db'}",
        bootstrap_token=SecretStr(ADMIN),
        provisioner_token=SecretStr(PROVISIONER),
    )
    with serve_admin(create_app(settings)) as url:
        spec = {"name": "clicks", "numEmbeddings": 10, "embeddingDim": 4, "shards": 2}
        headers = {"Authorization": f"Bearer {ADMIN}"}
        httpx.post(f"{url}/api/v1/tables", json=spec, headers=headers).raise_for_status()
        yield url


STATUS = TableStatus(  # the operator's status
    phase="Ready",
    observed_generation=1,
    slot_map_epoch=1,
    shards=[
        ShardStatus(index=i, endpoint=f"clicks-ps-{i}.clicks-ps.ml.svc.cluster.local:50051")
        for i in range(2)
    ],
)


async def test_the_provisioner_token_registers_nodes_and_writes_status(admin_url: str) -> None:
    mirror = AdminMirror(admin_url, PROVISIONER)
    try:
        assert await mirror.put_status("clicks", STATUS, LOG)
        assert await mirror.put_status(
            "clicks", STATUS.model_copy(update={"phase": "Degraded"}), LOG
        )
        assert not mirror.behind("clicks")
    finally:
        await mirror.aclose()
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=admin_url, headers=headers) as api:
        found = (await api.get("/api/v1/tables/clicks/discovery")).json()
        nodes = (await api.get("/api/v1/nodes")).json()
        events = (await api.get("/api/v1/events?action=node.register")).json()
    assert found["endpoints"] == [s.endpoint for s in STATUS.shards]
    assert all(n["provisioned"] for n in nodes["items"])
    assert events["total"] == 2  # registered once each, not again with every status


async def test_an_admin_token_is_refused(admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    mirror = AdminMirror(admin_url, ADMIN)
    try:
        assert not await mirror.put_status("clicks", STATUS, LOG)
        assert not mirror.behind("clicks")  # refused: sending it again would not help
    finally:
        await mirror.aclose()
    assert "403" in caplog.text and "provisioner" in caplog.text


async def test_a_status_that_did_not_reach_the_admin_api_is_behind() -> None:
    """An unreachable admin API leaves the table behind: the operator sends its status again
    at the next refresh even when it did not change (a checkpoint's outcome is not lost)."""
    from recstore.local.ports import free_port

    mirror = AdminMirror(f"http://127.0.0.1:{free_port()}", PROVISIONER, timeout=2)
    try:
        assert not await mirror.put_status("clicks", STATUS, LOG)
        assert mirror.behind("clicks") and not mirror.behind("other")
    finally:
        await mirror.aclose()


def test_the_operator_reads_its_provisioner_token_from_the_environment() -> None:
    env = {"RECSTORE_PROVISIONER_TOKEN": "p", "RECSTORE_ADMIN_TOKEN": "an-admin-token"}
    assert OperatorConfig.from_env(env).provisioner_token == "p"
    assert OperatorConfig.from_env({"RECSTORE_ADMIN_TOKEN": "a"}).provisioner_token is None


async def test_a_shard_removed_and_added_again_is_registered_again(admin_url: str) -> None:
    """2 -> 3 -> 2 -> 3: the shrink's status makes the admin API forget shard 2's node, so
    the mirror registers it again when the shard comes back (same stable endpoint)."""
    from recstore.core import SlotMap

    def status(shards: int, epoch: int) -> TableStatus:
        slot_map = SlotMap(epoch=epoch, ranges=SlotMap.initial(shards).ranges)
        endpoints = [f"clicks-ps-{i}.clicks-ps.ml.svc.cluster.local:50051" for i in range(shards)]
        shards_listed = [{"index": i, "endpoint": e} for i, e in enumerate(endpoints)]
        wire = {**STATUS.to_wire(), "slotMap": slot_map.to_dict(), "slotMapEpoch": epoch,
                "shards": shards_listed}  # fmt: skip
        return TableStatus.model_validate(wire)

    headers = {"Authorization": f"Bearer {ADMIN}"}
    mirror = AdminMirror(admin_url, PROVISIONER)
    try:
        async with httpx.AsyncClient(base_url=admin_url, headers=headers) as api:

            async def patch(shards: int) -> None:
                reply = await api.patch("/api/v1/tables/clicks", json={"shards": shards})
                reply.raise_for_status()

            async def indices() -> list[int]:
                return [n["shard_index"] for n in (await api.get("/api/v1/nodes")).json()["items"]]

            await patch(3)
            assert await mirror.put_status("clicks", status(3, 2), LOG)
            assert await indices() == [0, 1, 2]
            await patch(2)
            assert await mirror.put_status("clicks", status(2, 3), LOG)
            assert await indices() == [0, 1]
            await patch(3)
            assert await mirror.put_status("clicks", status(3, 4), LOG)
            assert await indices() == [0, 1, 2]
            found = (await api.get("/api/v1/tables/clicks/discovery")).json()
            assert len(found["endpoints"]) == 3
    finally:
        await mirror.aclose()
