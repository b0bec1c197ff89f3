"""The operator's job store over the CR status: the slot-map commit is a compare-and-swap.

Against the API double (a PUT with a stale resourceVersion gets 409, as on a real API
server): a commit from the expected epoch is stored, one from an older epoch is refused,
and a commit racing another writer of the status is re-read and decided again, keeping
what the other writer wrote.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import kopf
import pytest

from recstore.core.reshard.plan import Phase, ReshardJob
from recstore.core.routing import SlotMap
from recstore.operator.kube import Kube
from recstore.operator.reshard_store import StatusJobStore

from .conftest import ET, NS, ApiServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def store(api_server: ApiServer, api: httpx.AsyncClient) -> Any:
    table = {"apiVersion": "recstore.io/v1alpha1", "kind": "EmbeddingTable",
             "metadata": {"name": "t", "namespace": NS}, "spec": {"shards": 2},
             "status": {"phase": "Ready"}}  # fmt: skip
    (await api.post(ET, json=table)).raise_for_status()
    kube = Kube(kopf.ConnectionInfo(server=str(api_server.url), token="t"))
    yield StatusJobStore(kube, asyncio.get_running_loop(), NS, "t")
    await kube.aclose()


async def _status(api: httpx.AsyncClient) -> dict[str, Any]:
    return dict((await api.get(f"{ET}/t")).json()["status"])


async def test_commit_is_a_compare_and_swap_on_the_stored_epoch(
    store: StatusJobStore, api: httpx.AsyncClient
) -> None:
    first = SlotMap.initial(2)
    assert await asyncio.to_thread(store.initialise, first) == first
    assert await asyncio.to_thread(store.initialise, SlotMap.initial(3)) == first  # kept
    job = ReshardJob.start("t", first, 3)
    await asyncio.to_thread(store.save_job, job)
    assert await asyncio.to_thread(store.job) == job
    bumped = SlotMap(epoch=2, ranges=SlotMap.initial(3).ranges)
    assert await asyncio.to_thread(store.commit, 1, bumped)
    assert not await asyncio.to_thread(store.commit, 1, SlotMap.initial(2))  # moved on
    status = await _status(api)
    assert SlotMap.from_dict(status["slotMap"]) == bumped and status["slotMapEpoch"] == 2
    assert status["phase"] == "Ready"
    await asyncio.to_thread(store.save_job, job.at(Phase.done))
    assert (await asyncio.to_thread(store.job)) == job.at(Phase.done)


async def test_a_commit_racing_another_writer_is_decided_again(
    store: StatusJobStore, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await asyncio.to_thread(store.initialise, SlotMap.initial(2))
    replace, conflicts = store.kube.replace, []

    async def racing(url: str, body: dict[str, Any]) -> dict[str, Any]:
        if not conflicts:  # another writer (the status refresh) gets in first, once
            await store.kube.patch(url, {"status": {"phase": "Resharding"}})
        try:
            return await replace(url, body)
        except Exception as error:
            conflicts.append(error)
            raise

    monkeypatch.setattr(store.kube, "replace", racing)
    bumped = SlotMap(epoch=2, ranges=SlotMap.initial(2).ranges)
    assert await asyncio.to_thread(store.commit, 1, bumped)
    assert len(conflicts) == 1 and "409" in str(conflicts[0])
    status = await _status(api)
    assert status["phase"] == "Resharding"  # the other write is kept
    assert SlotMap.from_dict(status["slotMap"]).epoch == 2
