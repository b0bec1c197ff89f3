"""The real kopf operator against a Kubernetes API double (kmock) and a PS double.

Each test runs the operator (KopfRunner, fresh registry) and plays the
cluster's part: it applies EmbeddingTables over HTTP, writes StatefulSet and
pod status as the controllers and kubelet would, and checks the children,
the status, the admin API mirror and the gRPC calls to the shards.
"""

from __future__ import annotations

from typing import Any

import httpx
import kmock
import pytest

from .cluster_objects import MERGE, STS, condition, get, run_shards, status_of, table
from .conftest import ET, NS, ApiServer, FakePS, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SVC = f"/api/v1/namespaces/{NS}/services"
PDB = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"


async def test_apply_creates_children_then_becomes_ready(
    operator: Any, api: httpx.AsyncClient, fake_ps: FakePS, admin_server: kmock.RawHandler
) -> None:
    created = await api.post(ET, json=table())
    created.raise_for_status()
    uid = created.json()["metadata"]["uid"]

    sts = await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    svc = await wait_for(lambda: get(api, f"{SVC}/clicks-ps"), what="Service")
    pdb = await wait_for(lambda: get(api, f"{PDB}/clicks-ps"), what="PDB")
    for child in (sts, svc, pdb):
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["uid"] == uid and ref["kind"] == "EmbeddingTable" and ref["controller"]
    assert sts["spec"]["replicas"] == 2
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/recstore-ps:1.0"
    assert "--num-shards" in container["args"] and "$(RECSTORE_SHARD_INDEX)" in container["args"]
    assert svc["spec"]["clusterIP"] == "None"

    status = await wait_for(lambda: status_of(api), what="first status")
    assert status["phase"] in ("Pending", "Provisioning")
    assert condition(status, "SpecValid")["status"] == "True"

    await run_shards(api, "clicks", 2)
    status = await wait_for(
        lambda: _phase_is(api, "Ready"), what="phase Ready after the shards are ready"
    )
    assert status["readyShards"] == 2
    assert [s["endpoint"] for s in status["shards"]] == [
        f"clicks-ps-{i}.clicks-ps.default.svc.cluster.local:50051" for i in range(2)
    ]
    assert condition(status, "Ready")["reason"] == "AllShardsReady"
    # The table was created on both shards with the declared spec (and the PS token).
    assert len(fake_ps.created) == 2
    assert all(c["name"] == "clicks" and c["embeddingDim"] == 16 for c in fake_ps.created)

    # The admin API saw the Ready status, with the operator's token.
    def mirrored_ready() -> bool:
        puts = [r for r in admin_server if r.method == "PUT"]
        return any(
            r.url.path == "/api/v1/tables/clicks/status" and r.data["phase"] == "Ready"
            for r in puts
        )

    await wait_for(mirrored_ready, what="Ready status mirrored to the admin API")
    put = next(r for r in admin_server if r.method == "PUT")
    assert put.headers["Authorization"] == "Bearer provisioner-token"
    registrations = [r for r in admin_server if r.method == "POST"]
    assert {(r.data["shard_index"], r.data["endpoint"]) for r in registrations} == {
        (i, f"clicks-ps-{i}.clicks-ps.default.svc.cluster.local:50051") for i in range(2)
    }
    assert all(r.headers["Authorization"] == "Bearer provisioner-token" for r in registrations)


async def _phase_is(api: httpx.AsyncClient, phase: str, name: str = "clicks") -> Any:
    status = await status_of(api, name)
    return status if status.get("phase") == phase else None


async def test_invalid_spec_fails_and_creates_nothing(
    operator: Any, api: httpx.AsyncClient, api_server: ApiServer
) -> None:
    (await api.post(ET, json=table(embeddingDim=0))).raise_for_status()
    status = await wait_for(lambda: _phase_is(api, "Failed"), what="phase Failed")
    spec_valid = condition(status, "SpecValid")
    assert spec_valid["status"] == "False" and spec_valid["reason"] == "InvalidSpec"
    assert "spec.embeddingDim" in spec_valid["message"]
    for url in (STS, SVC, PDB):
        assert (await api.get(url)).json()["items"] == []
    assert len(api_server[kmock.action.CREATE, kmock.resource("apps/v1/statefulsets")]) == 0


async def test_inference_tables_get_the_read_only_token(
    operator: Any, api: httpx.AsyncClient
) -> None:
    (await api.post(ET, json=table("serving", mode="inference"))).raise_for_status()
    (await api.post(ET, json=table())).raise_for_status()
    serving = await wait_for(lambda: get(api, f"{STS}/serving-ps"), what="StatefulSet")
    training = await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    pod = serving["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    at = args.index("--read-only-token-file")
    assert args[at + 1] == "/var/run/secrets/recstore-read-only/token"
    assert "--auth-token-file" in args
    (volume,) = [v for v in pod["volumes"] if v["name"] == "read-only-token"]
    assert volume["secret"]["secretName"] == "ps-read-only-token"
    trainer = training["spec"]["template"]["spec"]
    assert "--read-only-token-file" not in trainer["containers"][0]["args"]
    assert all(v["name"] != "read-only-token" for v in trainer["volumes"])


async def test_image_change_rolls_the_statefulset(operator: Any, api: httpx.AsyncClient) -> None:
    (await api.post(ET, json=table())).raise_for_status()
    await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    await run_shards(api, "clicks", 2)
    await wait_for(lambda: _phase_is(api, "Ready"), what="Ready")

    change = {"spec": {"placement": {"image": "registry.example/recstore-ps:2.0"}}}
    (await api.patch(f"{ET}/clicks", json=change, headers=MERGE)).raise_for_status()

    async def rolled() -> Any:
        sts = await get(api, f"{STS}/clicks-ps")
        image = sts["spec"]["template"]["spec"]["containers"][0]["image"] if sts else None
        return sts if image == "registry.example/recstore-ps:2.0" else None

    sts = await wait_for(rolled, what="the new image in the pod template")
    assert sts["metadata"]["generation"] == 2  # the controller rolls the pods to it
    status = await wait_for(
        lambda: _observed(api, 2), what="the status of generation 2 while rolling"
    )
    assert status["phase"] == "Provisioning"
    assert condition(status, "Progressing")["reason"] == "RollingUpdate"


async def _observed(api: httpx.AsyncClient, generation: int) -> Any:
    status = await status_of(api)
    return status if status.get("observedGeneration") == generation else None


async def test_a_shard_count_change_the_nodes_cannot_take_part_in_changes_nothing(
    operator: Any, api: httpx.AsyncClient, api_server: ApiServer
) -> None:
    """These nodes answer no table stats, so no move can learn the map they serve: the
    change is flagged ReshardRequired and the StatefulSet is left alone (an online move
    against real nodes: test_operator_reshard_kmock.py)."""
    (await api.post(ET, json=table())).raise_for_status()
    await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    await run_shards(api, "clicks", 2)
    await wait_for(lambda: _phase_is(api, "Ready"), what="Ready")
    before = await get(api, f"{STS}/clicks-ps")
    sts_writes = len(api_server[kmock.resource("apps/v1/statefulsets"), "patch"])

    change = {"spec": {"shards": 3, "placement": {"image": "registry.example/recstore-ps:2.0"}}}
    (await api.patch(f"{ET}/clicks", json=change, headers=MERGE)).raise_for_status()

    async def reshard_flagged() -> Any:
        status = await status_of(api)
        conds = {c["type"]: c for c in status.get("conditions", [])}
        flagged = conds.get("ReshardRequired", {}).get("status") == "True"
        return status if flagged else None

    status = await wait_for(reshard_flagged, what="ReshardRequired")
    assert condition(status, "ReshardRequired")["reason"] == "ShardCountChanged"
    assert status["phase"] == "Ready"  # the two running shards still serve
    assert await get(api, f"{STS}/clicks-ps") == before
    assert len(api_server[kmock.resource("apps/v1/statefulsets"), "patch"]) == sts_writes


async def test_delete_takes_a_final_checkpoint_then_cleans_up(
    operator: Any, api: httpx.AsyncClient, fake_ps: FakePS
) -> None:
    (await api.post(ET, json=table())).raise_for_status()
    await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
    await run_shards(api, "clicks", 2)
    await wait_for(lambda: _phase_is(api, "Ready"), what="Ready")
    fake_ps.fail_saves = 1  # the first attempt fails on one shard: the operator retries

    (await api.delete(f"{ET}/clicks")).raise_for_status()

    async def gone() -> bool:
        return await get(api, f"{ET}/clicks") is None

    await wait_for(gone, what="the EmbeddingTable released by the operator")
    assert len(fake_ps.saves) >= 2 and len(set(fake_ps.saves)) == 1  # one checkpoint id
    assert fake_ps.saves[0].startswith("final-")
    for url in (f"{STS}/clicks-ps", f"{SVC}/clicks-ps", f"{PDB}/clicks-ps"):
        assert await get(api, url) is None
