"""Turn catalogue rows into API shapes: public bodies, discovery, audit snapshots.

Pure functions of the ORM rows (no session), so they are tested directly.
"""

from __future__ import annotations

from typing import Any

from recstore.admin.errors import NotReady
from recstore.admin.models import (
    CheckpointRecord,
    NodeRecord,
    PoolRecord,
    TableRecord,
    TokenRecord,
)
from recstore.admin.schemas import (
    CheckpointPublic,
    Discovery,
    NodePublic,
    PoolPublic,
    SlotMapPublic,
    TablePublic,
)
from recstore.core import DType, SlotMap, TableSpec
from recstore.core.pool import PoolSpec
from recstore.core.status import TableStatus


def spec_of(table: TableRecord) -> TableSpec:
    return TableSpec.model_validate(table.spec)


def slot_map_of(table: TableRecord) -> SlotMap:
    return SlotMap.from_dict(table.slot_map)


def shard_width(table: TableRecord) -> int:
    """Shards a table spans: its spec's count or its slot map's, the larger (while a move
    runs, both sets of nodes serve)."""
    return max(int(table.spec["shards"]), slot_map_of(table).num_shards)


def reshard_required(table: TableRecord) -> bool:
    """The catalogue asks for a shard count the running slot map does not have."""
    return int(table.spec["shards"]) != slot_map_of(table).num_shards


def status_of(table: TableRecord) -> TableStatus:
    """The table's status as reported, less the slot map (discovery serves it)."""
    shards = list(table.status_shards or [])
    return TableStatus.model_validate(
        {
            "phase": table.phase,
            "conditions": list(table.conditions or []),
            "observedGeneration": table.observed_generation,
            "readyShards": sum(bool(s.get("ready")) for s in shards),
            "shards": shards,
            "slotMapEpoch": table.slot_map.get("epoch"),
            "lastCheckpoint": table.last_checkpoint,
            "checkpointRequest": table.checkpoint_request,
        }
    )


def table_public(table: TableRecord) -> TablePublic:
    return TablePublic(
        name=table.name,
        spec=spec_of(table).to_wire(),
        pool=table.pool,
        generation=table.generation,
        resource_version=table.resource_version,
        status=status_of(table),
        reshard_required=reshard_required(table),
        rows=sum(n.rows for n in table.nodes),
        memory_bytes=sum(n.memory_bytes for n in table.nodes),
        created_by=table.created_by,
        created_at=table.created_at,
        updated_at=table.updated_at,
    )


def pool_spec_of(pool: PoolRecord) -> PoolSpec:
    return PoolSpec.model_validate(pool.spec)


def pool_public(pool: PoolRecord, tables: list[str]) -> PoolPublic:
    """``tables``: the catalogue's tables that name the pool."""
    return PoolPublic(
        name=pool.name,
        spec=pool_spec_of(pool).to_wire(),
        generation=pool.generation,
        resource_version=pool.resource_version,
        phase=pool.phase,
        status=pool.status,
        tables=tables,
        created_by=pool.created_by,
        created_at=pool.created_at,
        updated_at=pool.updated_at,
    )


def provisioned_endpoints(table: TableRecord) -> dict[int, str]:
    """Shard index -> endpoint of the nodes the provisioner identity registered."""
    return {n.shard_index: n.endpoint for n in table.nodes if n.provisioned}


def shard_endpoints(table: TableRecord, shards: int) -> list[str | None]:
    """Endpoint of each shard: where the provisioner registered its node, else None.

    A reported status may only name these endpoints (checked when it is
    written), so discovery reads the registrations alone: a status stored
    before that check existed cannot send trainers anywhere else.
    """
    endpoints: list[str | None] = [None] * shards
    for index, endpoint in provisioned_endpoints(table).items():
        if index < shards:
            endpoints[index] = endpoint
    return endpoints


def discovery(table: TableRecord) -> Discovery:
    """The SDK's view of a table; NotReady until every shard of the slot map has an endpoint."""
    spec = spec_of(table)
    slot_map = slot_map_of(table)
    shards = slot_map.num_shards
    endpoints = shard_endpoints(table, shards)
    missing = [i for i, e in enumerate(endpoints) if e is None]
    if missing:
        raise NotReady(
            f"table {table.name!r} is not ready: no endpoint yet for shard(s) {missing} "
            f"of {shards} (phase {table.phase})"
        )
    return Discovery(
        name=table.name,
        spec=spec.to_wire(),
        dtype=DType(spec.dtype).value,
        embedding_dim=spec.embedding_dim,
        num_embeddings=spec.num_embeddings,
        shards=shards,
        slot_map=SlotMapPublic.model_validate(slot_map.to_dict()),
        endpoints=[e for e in endpoints if e is not None],
    )


def node_public(node: NodeRecord) -> NodePublic:
    return NodePublic(
        id=node.id,
        table=node.table.name,
        shard_index=node.shard_index,
        endpoint=node.endpoint,
        metrics_endpoint=node.metrics_endpoint,
        ready=node.ready,
        rows=node.rows,
        memory_bytes=node.memory_bytes,
        registered_at=node.registered_at,
        last_heartbeat=node.last_heartbeat,
        registered_by=node.registered_by,
        provisioned=node.provisioned,
    )


def checkpoint_public(record: CheckpointRecord) -> CheckpointPublic:
    return CheckpointPublic(
        id=record.id,
        table=record.table.name,
        state=record.state,
        requested_by=record.requested_by,
        requested_at=record.requested_at,
        completed_at=record.completed_at,
        detail=record.detail,
    )


# --- audit snapshots: what "before" and "after" hold in an event ------------------


def table_snapshot(table: TableRecord) -> dict[str, Any]:
    snapshot = {
        "spec": dict(table.spec),
        "generation": table.generation,
        "resourceVersion": table.resource_version,
        "status": status_of(table).to_wire(),
    }
    if table.pool is not None:
        snapshot["pool"] = table.pool
    return snapshot


def pool_snapshot(pool: PoolRecord) -> dict[str, Any]:
    return {
        "spec": dict(pool.spec),
        "generation": pool.generation,
        "resourceVersion": pool.resource_version,
        "status": pool.status,
    }


def node_snapshot(node: NodeRecord) -> dict[str, Any]:
    return {
        "shard_index": node.shard_index,
        "endpoint": node.endpoint,
        "metrics_endpoint": node.metrics_endpoint,
        "ready": node.ready,
    }


def token_snapshot(token: TokenRecord) -> dict[str, Any]:
    """Never the hash, never the secret."""
    return {
        "id": token.id,
        "name": token.name,
        "role": token.role,
        "prefix": token.prefix,
        "revoked": token.revoked_at is not None,
    }
