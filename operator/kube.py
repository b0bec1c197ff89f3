"""A small async Kubernetes API client for the operator's children.

kopf owns the EmbeddingTable watch; the StatefulSet, Service, PDB and pods are
read and written here with httpx, using the same credentials kopf logged in
with (its ConnectionInfo gives the server, TLS context and auth headers). Only
the handful of calls the operator makes: get, list, create, merge-patch,
replace (compare-and-swap on resourceVersion), delete — each on a path built by ``path()``.
"""

from __future__ import annotations

from typing import Any

import httpx
import kopf

from recstore.core.resource import API_VERSION, KIND, PLURAL, POOL_KIND, POOL_PLURAL

#: (api prefix, plural) of every kind the operator touches.
KINDS = {
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Service": ("/api/v1", "services"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Pod": ("/api/v1", "pods"),
    "Secret": ("/api/v1", "secrets"),
    KIND: (f"/apis/{API_VERSION}", PLURAL),
    POOL_KIND: (f"/apis/{API_VERSION}", POOL_PLURAL),
}


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API error {status}: {message}")
        self.status = status


def path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    prefix, plural = KINDS[kind]
    out = f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        out += f"/{name}"
    if subresource:
        out += f"/{subresource}"
    return out


class Kube:
    """Async calls against the API server kopf is connected to."""

    def __init__(self, info: kopf.ConnectionInfo, *, timeout: float = 30.0) -> None:
        self._client = httpx.AsyncClient(
            base_url=info.server,
            headers={**info.as_http_headers(), "User-Agent": "recstore-operator"},
            verify=info.as_ssl_context(),
            timeout=timeout,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, url: str, **kwargs: Any) -> dict[str, Any] | None:
        response = await self._client.request(method, url, **kwargs)
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            try:
                message = response.json().get("message", response.text)
            except ValueError:
                message = response.text
            raise KubeError(response.status_code, f"{method} {url}: {message}")
        return response.json() if response.content else {}

    async def get(self, url: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        return await self._call("GET", url)

    async def list(self, url: str, *, labels: dict[str, str]) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        data = await self._call("GET", url, params={"labelSelector": selector})
        items = (data or {}).get("items") or []
        # Filter again: a server (or a test double) may ignore the selector.
        return [i for i in items if labels.items() <= (i["metadata"].get("labels") or {}).items()]

    async def create(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        created = await self._call("POST", url, json=body)
        if created is None:
            raise KubeError(404, f"POST {url}: not found")
        return created

    async def patch(self, url: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """JSON merge patch; None when the object does not exist."""
        headers = {"Content-Type": "application/merge-patch+json"}
        return await self._call("PATCH", url, json=body, headers=headers)

    async def replace(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT: fails with 409 when ``body``'s resourceVersion is no longer the stored one."""
        replaced = await self._call("PUT", url, json=body)
        if replaced is None:
            raise KubeError(404, f"PUT {url}: not found")
        return replaced

    async def delete(self, url: str) -> bool:
        """Delete; False when it was already gone."""
        return await self._call("DELETE", url) is not None
