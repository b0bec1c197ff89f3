"""Where tables and pools live in the Kubernetes API: the EmbeddingTable and EmbeddingPool
resources' names.

The operator serves the resources, the admin API's Kubernetes provisioner writes them, the
CLI reads their YAML and the CRDs are generated from these; each imports them from here, so
the group, version and plurals are spelled once. The annotations the components exchange
on the resource are in its group too, with how a checkpoint request is read from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recstore.core.checkpoint_status import TableCheckpoint, in_flight, parse_request
from recstore.core.status import TableStatus

GROUP = "recstore.io"
VERSION = "v1alpha1"
KIND = "EmbeddingTable"
PLURAL = "embeddingtables"
SINGULAR = "embeddingtable"
SHORT_NAMES = ("et",)
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"

#: the fleet many tables share (``recstore.core.pool``)
POOL_KIND = "EmbeddingPool"
POOL_PLURAL = "embeddingpools"
POOL_SINGULAR = "embeddingpool"
POOL_SHORT_NAMES = ("ep",)
POOL_CRD_NAME = f"{POOL_PLURAL}.{GROUP}"

#: The admin API writes the id of a requested checkpoint here; the operator takes it.
CHECKPOINT_REQUEST_ANNOTATION = f"{GROUP}/checkpoint-request"


def collection_path(namespace: str) -> str:
    """The API path of a namespace's EmbeddingTables (a name appended: one of them)."""
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"


def pool_collection_path(namespace: str) -> str:
    """The API path of a namespace's EmbeddingPools (a name appended: one of them)."""
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{POOL_PLURAL}"


def reported_request(resource: Mapping[str, Any]) -> TableCheckpoint | None:
    """The on-demand checkpoint the resource's status reports (``checkpointRequest``)."""
    status = TableStatus.from_stored(resource.get("status"))
    return status.checkpoint_request if status is not None else None


def waiting_request(resource: Mapping[str, Any]) -> int | None:
    """The checkpoint request the resource is annotated with whose outcome its status does
    not report yet; None when none waits. InvalidArgument when the annotation holds no
    request id."""
    annotations = (resource.get("metadata") or {}).get("annotations") or {}
    requested = parse_request(annotations.get(CHECKPOINT_REQUEST_ANNOTATION))
    return requested if in_flight(requested, reported_request(resource)) else None
