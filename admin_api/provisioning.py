"""Provisioners: what turns a catalogue change into running PS nodes.

The admin API hands every table change to one Provisioner. In a cluster it is
``KubernetesProvisioner``, which creates, patches and deletes EmbeddingTable
custom resources through the in-cluster API (the operator then reconciles
them); on a single machine ``LocalProvisionerHook`` forwards to whatever the
local ``recstore up`` provisioner attaches. Until something is attached, the
hook accepts changes and tables stay in phase Pending. Status flows back
through ``PUT /api/v1/tables/{name}/status``.

A requested checkpoint is handed over one at a time per table: while the last one
handed over has not been reported completed or failed, a provisioner refuses the
next with 409, and nothing is recorded.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx

from recstore.admin.errors import ProvisioningError
from recstore.core import TableSpec
from recstore.core.errors import InvalidArgument
from recstore.core.pool import PoolSpec
from recstore.core.resource import (
    API_VERSION,
    CHECKPOINT_REQUEST_ANNOTATION,
    KIND,
    POOL_KIND,
    collection_path,
    pool_collection_path,
    waiting_request,
)

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: how often a checkpoint request is annotated when the resource keeps changing under it
CONFLICT_ATTEMPTS = 3


@runtime_checkable
class Provisioner(Protocol):
    def create_table(self, spec: TableSpec, *, pool: str | None = None) -> None: ...

    def update_table(
        self, spec: TableSpec, *, previous: TableSpec, pool: str | None = None
    ) -> None: ...

    def delete_table(self, name: str) -> None: ...

    def request_checkpoint(self, name: str, checkpoint_id: int) -> None: ...

    def create_pool(self, name: str, spec: PoolSpec) -> None: ...

    def update_pool(self, name: str, spec: PoolSpec, *, previous: PoolSpec) -> None: ...

    def delete_pool(self, name: str) -> None: ...


class LocalProvisionerHook:
    """Forwards to the attached local provisioner; with none attached, changes stay Pending."""

    def __init__(self) -> None:
        self._target: Provisioner | None = None
        self._lock = threading.Lock()

    def attach(self, target: Provisioner) -> None:
        with self._lock:
            self._target = target

    def detach(self) -> None:
        with self._lock:
            self._target = None

    @property
    def attached(self) -> bool:
        return self._target is not None

    def _current(self) -> Provisioner | None:
        with self._lock:
            return self._target

    def create_table(self, spec: TableSpec, *, pool: str | None = None) -> None:
        if (target := self._current()) is not None:
            target.create_table(spec, pool=pool)

    def update_table(
        self, spec: TableSpec, *, previous: TableSpec, pool: str | None = None
    ) -> None:
        if (target := self._current()) is not None:
            target.update_table(spec, previous=previous, pool=pool)

    def delete_table(self, name: str) -> None:
        if (target := self._current()) is not None:
            target.delete_table(name)

    def request_checkpoint(self, name: str, checkpoint_id: int) -> None:
        if (target := self._current()) is not None:
            target.request_checkpoint(name, checkpoint_id)

    def create_pool(self, name: str, spec: PoolSpec) -> None:
        if (target := self._current()) is not None:
            target.create_pool(name, spec)

    def update_pool(self, name: str, spec: PoolSpec, *, previous: PoolSpec) -> None:
        if (target := self._current()) is not None:
            target.update_pool(name, spec, previous=previous)

    def delete_pool(self, name: str) -> None:
        if (target := self._current()) is not None:
            target.delete_pool(name)


def resource_name(table_name: str) -> str:
    """The CR's metadata.name: table names may hold '_', Kubernetes names may not."""
    return table_name.replace("_", "-")


def embedding_table_manifest(
    spec: TableSpec, namespace: str, pool: str | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": resource_name(spec.name),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "recstore-admin"},
        },
        "spec": table_resource_spec(spec, pool),
    }


def table_resource_spec(spec: TableSpec, pool: str | None) -> dict[str, Any]:
    """The EmbeddingTable's spec: a table on a pool names it and declares no shards (the
    operator refuses a table on a pool that does)."""
    wire = spec.to_wire()
    if pool is None:
        return wire
    wire.pop("shards", None)
    return {**wire, "pool": pool}


def embedding_pool_manifest(name: str, spec: PoolSpec, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": POOL_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "recstore-admin"},
        },
        "spec": spec.to_wire(),
    }


class KubernetesProvisioner:
    """EmbeddingTable custom resources through the Kubernetes API, with httpx."""

    def __init__(self, client: httpx.Client, namespace: str) -> None:
        self._client = client
        self._namespace = namespace

    @classmethod
    def in_cluster(
        cls, namespace: str | None = None, timeout: float = 10.0
    ) -> KubernetesProvisioner:
        """Use the pod's service account (token, CA, namespace) and KUBERNETES_SERVICE_*."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token_file = SERVICE_ACCOUNT_DIR / "token"
        if not host or not token_file.exists():
            raise RuntimeError(
                "RECSTORE_KUBERNETES=true but no in-cluster service account was found "
                "(KUBERNETES_SERVICE_HOST and /var/run/secrets/kubernetes.io/serviceaccount)"
            )
        if namespace is None:
            namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
        if ":" in host:
            host = f"[{host}]"
        client = httpx.Client(
            base_url=f"https://{host}:{port}",
            verify=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
            timeout=timeout,
            auth=_ServiceAccountAuth(token_file),
        )
        return cls(client, namespace)

    @property
    def _collection(self) -> str:
        return collection_path(self._namespace)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ProvisioningError(f"Kubernetes API unreachable: {exc}") from exc
        if response.status_code >= 400:
            message = (
                f"Kubernetes API answered {response.status_code} to {method} {path}: "
                f"{_k8s_message(response)}"
            )
            if response.status_code == 409:
                raise _Conflict(message, status_code=409)
            raise ProvisioningError(message, status_code=502)
        return response

    def create_table(self, spec: TableSpec, *, pool: str | None = None) -> None:
        manifest = embedding_table_manifest(spec, self._namespace, pool)
        self._call("POST", self._collection, json=manifest)

    def create_pool(self, name: str, spec: PoolSpec) -> None:
        manifest = embedding_pool_manifest(name, spec, self._namespace)
        self._call("POST", pool_collection_path(self._namespace), json=manifest)

    def update_pool(self, name: str, spec: PoolSpec, *, previous: PoolSpec) -> None:
        """The operator takes a changed pool (a changed shard count only flags the move due)."""
        self._call(
            "PATCH",
            f"{pool_collection_path(self._namespace)}/{name}",
            json={"spec": spec.to_wire()},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    def delete_pool(self, name: str) -> None:
        try:
            self._call("DELETE", f"{pool_collection_path(self._namespace)}/{name}")
        except ProvisioningError as exc:
            if "answered 404" not in str(exc):  # already gone is what we wanted
                raise

    def update_table(
        self, spec: TableSpec, *, previous: TableSpec, pool: str | None = None
    ) -> None:
        self._call(
            "PATCH",
            f"{self._collection}/{resource_name(spec.name)}",
            json={"spec": table_resource_spec(spec, pool)},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    def delete_table(self, name: str) -> None:
        try:
            self._call("DELETE", f"{self._collection}/{resource_name(name)}")
        except ProvisioningError as exc:
            if "answered 404" not in str(exc):  # already gone is what we wanted
                raise

    def request_checkpoint(self, name: str, checkpoint_id: int) -> None:
        """Annotate the resource with the request (the operator takes it), unless the one
        annotated before still waits for its outcome in the resource's status (409). The
        annotation carries the resourceVersion read: when the resource changed meanwhile
        it is read again and the same decided anew, so a request annotated meanwhile is
        never replaced."""
        for _ in range(CONFLICT_ATTEMPTS - 1):
            try:
                return self._annotate_request(name, checkpoint_id)
            except _Conflict:
                continue  # written meanwhile: read it again
        return self._annotate_request(name, checkpoint_id)

    def _annotate_request(self, name: str, checkpoint_id: int) -> None:
        url = f"{self._collection}/{resource_name(name)}"
        resource = self._call("GET", url).json()
        metadata = resource.get("metadata") or {}
        try:
            waiting = waiting_request(resource)
        except InvalidArgument:
            waiting = None  # an annotation that is no request id: replaced
        if waiting is not None:
            raise ProvisioningError(
                f"checkpoint {waiting} of table {name!r} is still running (the operator has "
                "not reported it completed or failed); request another once it has",
                status_code=409,
            )
        asking = {CHECKPOINT_REQUEST_ANNOTATION: str(checkpoint_id)}
        change: dict[str, Any] = {"annotations": asking}
        if metadata.get("resourceVersion"):
            change["resourceVersion"] = metadata["resourceVersion"]
        body = {"metadata": change}
        self._call(
            "PATCH", url, json=body, headers={"Content-Type": "application/merge-patch+json"}
        )


class _Conflict(ProvisioningError):
    """The API server's 409: the object exists, or changed since it was read."""


class _ServiceAccountAuth(httpx.Auth):
    """Bearer auth that re-reads the projected token (kubelet rotates it)."""

    def __init__(self, token_file: Path) -> None:
        self._token_file = token_file

    def auth_flow(self, request: httpx.Request) -> Any:
        request.headers["Authorization"] = f"Bearer {self._token_file.read_text().strip()}"
        yield request


def _k8s_message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))[:500]
    except ValueError:
        return response.text[:500]
