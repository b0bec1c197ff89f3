"""The EmbeddingTable body and the object reads the kmock operator tests share.

Each test plays the cluster over the API double's HTTP interface: it applies an
EmbeddingTable, plays the StatefulSet controller and kubelet (``run_shards``), reads
back the children and the status the operator wrote, and looks for one condition in
that status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from recstore.core.resource import API_VERSION, KIND

from .conftest import ET, NS

STS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
PODS = f"/api/v1/namespaces/{NS}/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}


def table(name: str = "clicks", **spec: Any) -> dict[str, Any]:
    body = {"numEmbeddings": 1000, "embeddingDim": 16, "shards": 2, **spec}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


async def get(api: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    response = await api.get(url)
    return response.json() if response.status_code == 200 else None


async def status_of(api: httpx.AsyncClient, name: str = "clicks") -> dict[str, Any]:
    return ((await get(api, f"{ET}/{name}")) or {}).get("status") or {}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


async def run_shards(
    api: httpx.AsyncClient,
    name: str,
    shards: int,
    pod_ip: Callable[[int], str] = lambda index: "127.0.0.1",
    *,
    suffix: str = "-ps",
) -> None:
    """Play the StatefulSet controller and kubelet: every shard pod up and ready (pod i at
    ``pod_ip(i)``); ``suffix``: "-pool" for a pool's StatefulSet."""
    workload = f"{name}{suffix}"
    sts = await get(api, f"{STS}/{workload}")
    assert sts is not None
    selector = sts["spec"]["selector"]["matchLabels"]
    generation = sts["metadata"]["generation"]
    sts_status = {
        "replicas": shards,
        "readyReplicas": shards,
        "updatedReplicas": shards,
        "observedGeneration": generation,
        "currentRevision": f"{workload}-{generation}",
        "updateRevision": f"{workload}-{generation}",
    }
    url = f"{STS}/{workload}/status"
    patched = await api.patch(url, json={"status": sts_status}, headers=MERGE)
    patched.raise_for_status()
    for i in range(shards):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{workload}-{i}",
                "namespace": NS,
                "labels": {**selector, "apps.kubernetes.io/pod-index": str(i)},
            },
            "status": {
                "podIP": pod_ip(i),
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "ps", "restartCount": 0}],
            },
        }
        if await get(api, f"{PODS}/{workload}-{i}") is None:
            (await api.post(PODS, json=pod)).raise_for_status()
