"""From the StatefulSet and its pods to the reconcile core's Observation.

The StatefulSet says how many shards run and whether a rollout is under way;
each pod's Ready condition (driven by the gRPC readiness probe) says whether
its shard serves. Pure functions over the API objects, so the same inputs a
test writes into the API double give the same status.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recstore.core.reconcile import Observation, ShardState


def statefulset_rolling(sts: Mapping[str, Any]) -> bool:
    """Whether the StatefulSet controller has yet to bring every pod to the latest template."""
    spec, status = sts.get("spec") or {}, sts.get("status") or {}
    generation = (sts.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return True
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if current and update and current != update:
        return True
    replicas = spec.get("replicas", 1)
    return int(status.get("updatedReplicas", replicas) or 0) < replicas


def pod_ready(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when it cannot place ``pod`` (e.g. no node with a free GPU)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    for c in conditions:
        scheduled = c.get("type") == "PodScheduled" and c.get("status") == "False"
        if scheduled and c.get("reason") == "Unschedulable":
            return str(c.get("message") or "no node fits the pod")
    return None


def observe(
    sts: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    endpoint_of: Callable[[int], str],
) -> Observation:
    """What runs for a table: shard count, rollout state and per-shard readiness."""
    if sts is None:
        return Observation()
    replicas = int((sts.get("spec") or {}).get("replicas", 1))
    name = sts["metadata"]["name"]
    by_name = {p["metadata"]["name"]: p for p in pods}
    shards = tuple(
        ShardState(
            index=i,
            endpoint=endpoint_of(i),
            ready=pod_ready(by_name.get(f"{name}-{i}", {})),
        )
        for i in range(replicas)
    )
    # A shard the scheduler cannot place fails the table with the scheduler's words (it
    # stays so until nodes change; the next refresh clears it once the pod is placed).
    stuck = [
        f"shard {i} cannot be scheduled: {why}"
        for i in range(replicas)
        if (why := unschedulable(by_name.get(f"{name}-{i}", {}))) is not None
    ]
    return Observation(
        running_shards=replicas,
        rolling=statefulset_rolling(sts),
        shards=shards,
        refused="; ".join(stuck) or None,
    )


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` changes anything (the core keeps timestamps stable).

    ``new`` goes as a merge patch, whose nulls delete: the stored status holds no null
    field, so a null compares as an absent one."""
    previous = previous or {}
    return any(_as_stored(previous.get(key)) != _as_stored(value) for key, value in new.items())


def _as_stored(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _as_stored(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_as_stored(item) for item in value]
    return value


def applied_generation_current(body: Mapping[str, Any]) -> bool:
    """Whether the stored status describes the resource's current generation.

    The periodic refresh runs beside the apply handlers and may hold a body read
    before an apply published a newer ``observedGeneration``; writing its status
    then would put the older generation back (and keep it there, since each
    refresh starts from the stored one). While a spec change is not yet applied,
    only the apply handler writes the status.
    """
    generation = (body.get("metadata") or {}).get("generation")
    observed = (body.get("status") or {}).get("observedGeneration")
    return generation is None or observed is None or int(observed) == int(generation)
