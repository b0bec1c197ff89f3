"""The EmbeddingTable body and the object reads the kmock operator tests share.

Each test plays the cluster over the API double's HTTP interface: it applies an
EmbeddingTable, reads back the children and the status the operator wrote, and
looks for one condition in that status.
"""

from __future__ import annotations

from typing import Any

import httpx

from .conftest import ET, NS

STS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
PODS = f"/api/v1/namespaces/{NS}/pods"


def table(name: str = "clicks", **spec: Any) -> dict[str, Any]:
    body = {"numEmbeddings": 1000, "embeddingDim": 16, "shards": 2, **spec}
    return {
        "apiVersion": "recstore.io/v1alpha1",
        "kind": "EmbeddingTable",
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
