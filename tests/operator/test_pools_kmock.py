"""The real operator (kmock API double, a PS double on loopback) running EmbeddingPools.

A pool renders one StatefulSet, Service and PDB; tables naming it are created on its
nodes (CreateTable on the pool's pods, with their own slot map) and make no children of
their own; the pool's status lists them with the memory they reserve per node. A table
on a pool that does not exist waits (Pending, condition Pool naming it) and proceeds once
the pool appears; one that does not fit is Failed with the figures and created nowhere;
one that also declares shards is refused; a pool still holding tables is not deleted;
deleting a table drops it from the pool's nodes, the pool and its other tables stay; a
shrink its tables would not fit is refused with the figures before anything moves.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from kopf.testing import KopfRunner

from recstore.core.pool_capacity import NODE_BYTES, footprint
from recstore.core.resource import API_VERSION, POOL_KIND, pool_collection_path
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec

from .cluster_objects import STS, condition, get, run_shards, status_of, table
from .conftest import ET, NS, FakePS, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

EP = pool_collection_path(NS)


def pool(name: str = "model", **spec: Any) -> dict[str, Any]:
    body = {"shards": 2, "placement": {"resources": {"memory": "1Gi"}}, **spec}
    return {"apiVersion": API_VERSION, "kind": POOL_KIND,
            "metadata": {"name": name, "namespace": NS}, "spec": body}  # fmt: skip


def on_pool(name: str, rows: int = 1000, pool_name: str = "model") -> dict[str, Any]:
    body = table(name, pool=pool_name, numEmbeddings=rows)
    del body["spec"]["shards"]
    return body


async def phase(api: httpx.AsyncClient, name: str, wanted: str) -> dict[str, Any] | None:
    status = await status_of(api, name)
    return status if status.get("phase") == wanted else None


async def pool_status(api: httpx.AsyncClient, name: str = "model") -> dict[str, Any]:
    return ((await get(api, f"{EP}/{name}")) or {}).get("status") or {}


async def test_tables_share_the_pool_fleet_and_its_capacity(
    operator: KopfRunner, api: httpx.AsyncClient, fake_ps: FakePS
) -> None:
    (await api.post(EP, json=pool())).raise_for_status()
    sts = await wait_for(lambda: get(api, f"{STS}/model-pool"), what="the pool's StatefulSet")
    assert sts["spec"]["replicas"] == 2
    assert sts["metadata"]["ownerReferences"][0]["kind"] == POOL_KIND
    await run_shards(api, "model", 2, suffix="-pool")
    for name in ("a", "b"):
        (await api.post(ET, json=on_pool(name))).raise_for_status()
    for name in ("a", "b"):
        status = await wait_for(lambda n=name: phase(api, n, "Ready"), what=f"{name} Ready")
        assert condition(status, "Pool")["status"] == "True"
        assert condition(status, "Capacity")["status"] == "True"
        assert (
            len(status["shards"]) == 2
            and "model-pool-0.model-pool" in (status["shards"][0]["endpoint"])
        )
    assert await get(api, f"{STS}/a-ps") is None  # no fleet of its own
    assert sorted({c["name"] for c in fake_ps.created}) == ["a", "b"]
    assert all(c["shards"] == 2 for c in fake_ps.created)

    async def listed() -> dict[str, Any] | None:
        status = await pool_status(api)
        return status if [t["name"] for t in status.get("tables", [])] == ["a", "b"] else None

    status = await wait_for(listed, what="the pool lists its tables")
    each = status["tables"][0]["memoryBytes"]
    assert each > 0 and status["memory"]["reservedBytes"] == 2 * each
    assert status["memory"]["requestBytes"] == 2**30

    # too large for what the pool's nodes have left: Failed with the figures, created nowhere
    (await api.post(ET, json=on_pool("huge", rows=50_000_000))).raise_for_status()
    status = await wait_for(lambda: phase(api, "huge", "Failed"), what="huge Failed")
    refused = condition(status, "Capacity")
    assert refused["status"] == "False" and refused["reason"] == "Exceeded"
    assert "'huge' needs" in refused["message"] and "pool 'model'" in refused["message"]
    assert "MiB" in refused["message"]
    assert "huge" not in {c["name"] for c in fake_ps.created}

    # the pool refuses deletion while it holds tables, naming them
    (await api.delete(f"{EP}/model")).raise_for_status()

    async def blocked() -> dict[str, Any] | None:
        status = await pool_status(api)
        found = [c for c in status.get("conditions", []) if c["type"] == "Deletable"]
        return found[0] if found and found[0]["status"] == "False" else None

    deletable = await wait_for(blocked, what="deletion refused")
    assert "a, b, huge" in deletable["message"]
    assert await get(api, f"{STS}/model-pool") is not None

    # deleting a table drops it from the pool's nodes; the others stay
    (await api.delete(f"{ET}/a")).raise_for_status()
    await wait_for(lambda: "a" in fake_ps.dropped, what="a dropped from the nodes")
    await wait_for(lambda: _gone(api, "a"), what="a deleted")
    assert fake_ps.dropped.count("b") == 0
    # its final checkpoint is of it alone: the pool's nodes hold b too
    saves = zip(fake_ps.saves, fake_ps.saved_tables, strict=True)
    finals = [tables for checkpoint, tables in saves if checkpoint.startswith("final-")]
    assert finals and set(finals) == {("a",)}
    assert (await status_of(api, "b")).get("phase") == "Ready"
    for name in ("b", "huge"):
        (await api.delete(f"{ET}/{name}")).raise_for_status()
        await wait_for(lambda n=name: _gone(api, n), what=f"{name} deleted")
    await wait_for(lambda: _gone(api, "model", EP), what="the empty pool deleted")


async def _gone(api: httpx.AsyncClient, name: str, collection: str = ET) -> bool:
    return await get(api, f"{collection}/{name}") is None


async def test_a_table_waits_for_its_pool_and_proceeds_when_it_appears(
    operator: KopfRunner, api: httpx.AsyncClient, fake_ps: FakePS
) -> None:
    (await api.post(ET, json=on_pool("early", pool_name="later"))).raise_for_status()
    status = await wait_for(lambda: phase(api, "early", "Pending"), what="Pending")
    waiting = condition(status, "Pool")
    assert waiting["status"] == "False" and "pool 'later' does not exist" in waiting["message"]
    assert fake_ps.created == []
    (await api.post(EP, json=pool("later"))).raise_for_status()
    await wait_for(lambda: get(api, f"{STS}/later-pool"), what="the pool's StatefulSet")
    await run_shards(api, "later", 2, suffix="-pool")
    status = await wait_for(lambda: phase(api, "early", "Ready"), what="Ready on the pool")
    assert condition(status, "Pool")["status"] == "True"
    assert {c["name"] for c in fake_ps.created} == {"early"}


async def test_a_table_on_a_pool_with_shards_of_its_own_is_refused(
    operator: KopfRunner, api: httpx.AsyncClient, fake_ps: FakePS
) -> None:
    (await api.post(EP, json=pool())).raise_for_status()
    (await api.post(ET, json=table("both", pool="model", shards=3))).raise_for_status()
    status = await wait_for(lambda: phase(api, "both", "Failed"), what="Failed")
    invalid = condition(status, "SpecValid")
    assert invalid["status"] == "False"
    assert "spec.shards: a table on pool 'model' runs on the pool's nodes" in invalid["message"]
    assert await get(api, f"{STS}/both-ps") is None and fake_ps.created == []


async def test_a_shrink_the_tables_would_not_fit_is_refused_and_nothing_moves(
    operator: KopfRunner, api: httpx.AsyncClient, fake_ps: FakePS
) -> None:
    rows = 200_000
    spec = TableSpec(name="t", num_embeddings=rows, embedding_dim=16)
    on3, on2 = footprint(spec, 3).host, footprint(spec, 2).host
    memory = (NODE_BYTES + 2 * on3 + (2 * on2 - 2 * on3) // 2) // 2**20  # 2 fit on 3, not on 2
    body = pool(shards=3, placement={"resources": {"memory": f"{memory}Mi"}})
    (await api.post(EP, json=body)).raise_for_status()
    await wait_for(lambda: get(api, f"{STS}/model-pool"), what="the pool's StatefulSet")
    await run_shards(api, "model", 3, suffix="-pool")
    for name in ("a", "b"):
        (await api.post(ET, json=on_pool(name, rows=rows))).raise_for_status()
        await wait_for(lambda n=name: phase(api, n, "Ready"), what=f"{name} Ready")
    maps = [(await status_of(api, name))["slotMap"] for name in ("a", "b")]
    assert [SlotMap.from_dict(m).num_shards for m in maps] == [3, 3]  # stored at creation

    headers = {"Content-Type": "application/merge-patch+json"}
    patch = {"spec": {"shards": 2}}
    (await api.patch(f"{EP}/model", json=patch, headers=headers)).raise_for_status()

    async def refused() -> dict[str, Any] | None:
        found = [c for c in (await pool_status(api)).get("conditions", [])
                 if c["type"] == "Resharding"]  # fmt: skip
        return found[0] if found and found[0]["reason"] == "CapacityExceeded" else None

    resharding = await wait_for(refused, what="the shrink refused")
    assert resharding["status"] == "False"
    assert "from 3 to 2 nodes is refused and nothing moved" in resharding["message"]
    assert "table 'b' needs" in resharding["message"] and "MiB" in resharding["message"]
    status = await pool_status(api)
    assert condition(status, "ReshardRequired")["status"] == "True"
    assert (await get(api, f"{STS}/model-pool") or {})["spec"]["replicas"] == 3
    for name, stored in zip(("a", "b"), maps, strict=True):
        now = await status_of(api, name)
        assert now["slotMap"] == stored and now.get("migrationJob") is None
