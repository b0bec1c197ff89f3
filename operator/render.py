"""Pure rendering of a fleet's children: StatefulSet, headless Service, PDB.

A fleet is a table's own (the EmbeddingTable owns the children) or an
EmbeddingPool's that many tables share (the pool owns them); both render the
same way from a ``recstore.core.fleet.Fleet``, only their names and selector differ.

One pod per shard in a StatefulSet: the pod ordinal is the shard index (read
from the ``apps.kubernetes.io/pod-index`` label through the downward API), the
ordinal's stable DNS name is the shard endpoint, and the PVC template gives
every shard its own data dir that survives rescheduling. Everything here is a
function of the validated declaration and a few operator options, so the
handlers stay thin and every object can be schema-checked offline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recstore.core.fleet import DATA_DIR, GRPC_PORT, METRICS_PORT, Fleet, node_args
from recstore.core.placement import Spread
from recstore.core.reconcile import LIVENESS_SERVICE, Declaration
from recstore.core.resource import API_VERSION, GROUP, KIND, POOL_KIND
from recstore.core.tls import ServerTls

SHARD_INDEX_ENV = "RECSTORE_SHARD_INDEX"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
TOKEN_DIR = "/var/run/secrets/recstore"
READ_ONLY_TOKEN_DIR = "/var/run/secrets/recstore-read-only"
#: where a PS pod mounts its TLS Secret (keys as cert-manager writes them)
TLS_DIR = "/var/run/secrets/recstore-tls"
TLS_KEYS = ("tls.crt", "tls.key", "ca.crt")
GPU_RESOURCE = "nvidia.com/gpu"
SHARDS_ANNOTATION = f"{GROUP}/shards"
#: uid and gid of the ``recstore`` user in the recstore-ps image (docker/ps-node.Dockerfile).
#: It is also the pod's fsGroup: a fresh data PVC is root-owned, and the node must write
#: its checkpoints and WAL there.
PS_UID = 10001
#: the root filesystem is read-only; scratch files (Python, CUDA, gRPC) go to this emptyDir.
TMP_DIR = "/tmp"
#: bounded so a runaway scratch writer gets its pod evicted instead of filling the node's disk.
TMP_SIZE_LIMIT = "1Gi"
#: the StatefulSet controller labels pods with "<name>-<10-char hash>", 63 chars at most.
MAX_RESOURCE_NAME = 63 - len("-ps") - 11
#: a pool's children end in "-pool" (a table's in "-ps"): the two never share a name
POOL_SUFFIX = "-pool"
MAX_POOL_NAME = 63 - len(POOL_SUFFIX) - 11
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Owner:
    """The EmbeddingTable (or EmbeddingPool) the children belong to."""

    name: str
    namespace: str
    uid: str
    api_version: str = API_VERSION
    kind: str = KIND


@dataclass(frozen=True)
class RenderOptions:
    default_image: str = "recstore-ps:latest"
    #: Secret whose key ``token`` the PS nodes read as their auth token.
    token_secret: str | None = None
    #: Secret whose key ``token`` the nodes of inference tables read as their read-only
    #: token (``recstore.core.fleet.Fleet.read_only_tokens``); needs ``token_secret``.
    read_only_token_secret: str | None = None
    cluster_domain: str = "cluster.local"
    #: Secret with ``tls.crt``, ``tls.key``, ``ca.crt``: the nodes serve gRPC over TLS.
    tls_secret: str | None = None
    #: the nodes require client certificates signed by that ``ca.crt``.
    tls_mutual: bool = False

    @property
    def server_tls(self) -> ServerTls | None:
        """The TLS the PS pods serve with, as paths inside the pod."""
        if not self.tls_secret:
            return None
        cert, key, ca = (Path(TLS_DIR, name) for name in TLS_KEYS)
        return ServerTls(cert, key, ca if self.tls_mutual else None)


def name_problem(name: str, *, longest: int = MAX_RESOURCE_NAME) -> str | None:
    """Why a resource name cannot name the children (None when it can)."""
    if not _DNS_LABEL.fullmatch(name):
        return (
            f"metadata.name {name!r} must be a DNS label (lowercase letters, digits, '-', "
            "starting with a letter): it names the shards' Service and pods"
        )
    if len(name) > longest:
        return f"metadata.name {name!r} is longer than {longest} characters"
    return None


def workload_name(table: str) -> str:
    return f"{table}-ps"


def is_pool(owner: Owner) -> bool:
    return owner.kind == POOL_KIND


def fleet_name(owner: Owner) -> str:
    """The StatefulSet, Service and PDB name of a table's own fleet or of a pool."""
    return f"{owner.name}{POOL_SUFFIX}" if is_pool(owner) else workload_name(owner.name)


def selector_labels(owner: Owner) -> dict[str, str]:
    app = "recstore-pool" if is_pool(owner) else "recstore-ps"
    return {"app.kubernetes.io/name": app, "app.kubernetes.io/instance": owner.name}


def as_fleet(fleet: Fleet | Declaration) -> Fleet:
    return fleet.fleet if isinstance(fleet, Declaration) else fleet


def labels(owner: Owner) -> dict[str, str]:
    return {
        **selector_labels(owner),
        "app.kubernetes.io/component": "ps-node",
        "app.kubernetes.io/part-of": "recstore",
        "app.kubernetes.io/managed-by": "recstore-operator",
    }


def shard_endpoint(owner: Owner, index: int, options: RenderOptions) -> str:
    """Stable DNS name and port of shard ``index`` (its StatefulSet pod)."""
    name = fleet_name(owner)
    return f"{name}-{index}.{name}.{owner.namespace}.svc.{options.cluster_domain}:{GRPC_PORT}"


def _meta(owner: Owner, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner),
        "ownerReferences": [
            {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def render_service(owner: Owner) -> dict[str, Any]:
    """Headless Service: gives every shard pod a stable DNS name."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, fleet_name(owner)),
        "spec": {
            "clusterIP": "None",
            # Shard names resolve while a pod starts: clients see UNAVAILABLE, not NXDOMAIN.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(owner),
            "ports": [
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "appProtocol": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }


def render_pdb(owner: Owner) -> dict[str, Any]:
    """At most one shard down by voluntary disruption: each shard holds distinct rows."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, fleet_name(owner)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner)}},
    }


def _resources(fleet: Fleet) -> dict[str, Any]:
    res = fleet.placement.resources
    requests: dict[str, str] = {"cpu": res.cpu, "memory": res.memory}
    limits: dict[str, str] = {"memory": res.memory_limit or res.memory}
    if res.cpu_limit:
        limits["cpu"] = res.cpu_limit
    if fleet.placement.gpus:  # extended resources: request == limit
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(fleet.placement.gpus)
    return {"requests": requests, "limits": limits}


def _affinity(owner: Owner, spread: Spread) -> dict[str, Any] | None:
    term = {
        "labelSelector": {"matchLabels": selector_labels(owner)},
        "topologyKey": "kubernetes.io/hostname",
    }
    if spread == Spread.required:
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    if spread == Spread.preferred:
        preferred = [{"weight": 100, "podAffinityTerm": term}]
        return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    return None


def _tolerations(fleet: Fleet) -> list[dict[str, Any]]:
    out = [t.model_dump(by_alias=True, exclude_none=True) for t in fleet.placement.tolerations]
    if fleet.placement.gpus:  # GPU nodes are commonly tainted for GPU workloads only
        gpu = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        if gpu not in out:
            out.append(gpu)
    return out


def pod_security_context() -> dict[str, Any]:
    """Non-root pod with the RuntimeDefault seccomp profile; fsGroup makes the PVC writable.

    OnRootMismatch changes volume ownership only when the volume root is not already
    owned by the group, so restarts on a large data dir do not walk every file.
    """
    return {
        "runAsNonRoot": True,
        "runAsUser": PS_UID,
        "runAsGroup": PS_UID,
        "fsGroup": PS_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """Read-only root, no privilege escalation, no capabilities: the chart's container rules."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def scrape_annotations() -> dict[str, str]:
    """Prometheus annotation-based discovery of the node's /metrics port."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }


def render_pod_template(
    owner: Owner, declared: Fleet | Declaration, options: RenderOptions
) -> dict[str, Any]:
    fleet = as_fleet(declared)
    token_file = f"{TOKEN_DIR}/token" if options.token_secret else None
    read_only_secret = (
        options.read_only_token_secret if options.token_secret and fleet.read_only_tokens else None
    )
    args = node_args(
        fleet,
        shard_index=f"$({SHARD_INDEX_ENV})",
        auth_token_file=token_file,
        read_only_token_file=f"{READ_ONLY_TOKEN_DIR}/token" if read_only_secret else None,
        tls=options.server_tls,
    )
    probe = {"grpc": {"port": GRPC_PORT}, "periodSeconds": 10, "timeoutSeconds": 5}
    container: dict[str, Any] = {
        "name": "ps",
        "image": fleet.placement.image or options.default_image,
        "command": ["recstore"],
        "args": args,
        "env": [
            {
                "name": SHARD_INDEX_ENV,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}},
            },
        ],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(fleet),
        # Loading a large checkpoint takes a while: the startup probe covers it (10 min).
        "startupProbe": {**probe, "failureThreshold": 60},
        "readinessProbe": {**probe, "failureThreshold": 2},
        # alive while writes are stopped by a log failure: a restart would not serve reads
        "livenessProbe": {
            **probe,
            "grpc": {"port": GRPC_PORT, "service": LIVENESS_SERVICE},
            "failureThreshold": 6,
        },
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "tmp", "mountPath": TMP_DIR},
        ],
    }
    pod: dict[str, Any] = {
        # a PS node never calls the Kubernetes API: no service account token in its pods
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": fleet.placement.termination_grace_seconds,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}}],
    }
    if options.token_secret:
        container["volumeMounts"].append(
            {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True}
        )
        pod["volumes"].append(
            {
                "name": "token",
                "secret": {
                    "secretName": options.token_secret,
                    "items": [{"key": "token", "path": "token"}],
                },
            }
        )
    if read_only_secret:
        container["volumeMounts"].append(
            {"name": "read-only-token", "mountPath": READ_ONLY_TOKEN_DIR, "readOnly": True}
        )
        pod["volumes"].append(
            {
                "name": "read-only-token",
                "secret": {
                    "secretName": read_only_secret,
                    "items": [{"key": "token", "path": "token"}],
                },
            }
        )
    if options.tls_secret:
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        pod["volumes"].append(
            {
                "name": "tls",
                "secret": {
                    "secretName": options.tls_secret,
                    "items": [{"key": key, "path": key} for key in TLS_KEYS],
                },
            }
        )
    if fleet.table is not None:  # a table's own fleet: the one table its nodes serve
        container["env"].append({"name": "RECSTORE_TABLE", "value": fleet.table})
    if fleet.placement.node_selector:
        pod["nodeSelector"] = dict(fleet.placement.node_selector)
    if tolerations := _tolerations(fleet):
        pod["tolerations"] = tolerations
    if affinity := _affinity(owner, Spread(fleet.placement.spread)):
        pod["affinity"] = affinity
    metadata = {"labels": labels(owner), "annotations": scrape_annotations()}
    return {"metadata": metadata, "spec": pod}


def render_statefulset(
    owner: Owner, declared: Fleet | Declaration, options: RenderOptions
) -> dict[str, Any]:
    fleet = as_fleet(declared)
    storage = fleet.placement.storage
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        claim_spec["storageClassName"] = storage.storage_class_name
    meta = _meta(owner, fleet_name(owner))
    meta["annotations"] = {SHARDS_ANNOTATION: str(fleet.shards)}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "serviceName": fleet_name(owner),
            "replicas": fleet.shards,
            "podManagementPolicy": "Parallel",  # shards are independent: start them together
            # partition 0: an apply rolls every pod, also those a grow kept on their revision
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain" if storage.retain_on_delete else "Delete",
                "whenScaled": "Retain",
            },
            "selector": {"matchLabels": selector_labels(owner)},
            "template": render_pod_template(owner, fleet, options),
            "volumeClaimTemplates": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "labels": selector_labels(owner)},
                    "spec": claim_spec,
                }
            ],
        },
    }


def statefulset_update(desired: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that moves a running StatefulSet to ``desired``.

    Only mutable fields: the API server refuses changes to the selector,
    service name, pod management policy and claim templates, and the replica
    count only changes through resharding.
    """
    spec = desired["spec"]
    return {
        "metadata": {k: desired["metadata"][k] for k in ("labels", "annotations")},
        "spec": {
            k: spec[k]
            for k in ("template", "updateStrategy", "persistentVolumeClaimRetentionPolicy")
        },
    }
