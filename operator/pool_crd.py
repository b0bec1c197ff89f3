"""The EmbeddingPool CRD, generated from the pool's spec and status models.

As the EmbeddingTable's (``recstore.operator.crd``): the schema comes from
``PoolSpec`` and ``PoolStatus`` in ``recstore.core.pool`` through the same
structural conversion, so the API server keeps exactly what the operator
validates and writes. ``scripts/gen_crd.py`` writes it into the chart.
"""

from __future__ import annotations

from typing import Any

from recstore.core.pool import PoolSpec, PoolStatus
from recstore.core.resource import POOL_KIND, POOL_PLURAL, POOL_SHORT_NAMES, POOL_SINGULAR
from recstore.operator.crd import crd_object, to_structural

#: `kubectl explain` texts for the fields whose models carry no description.
_SPEC_DESCRIPTIONS = {
    "shards": "PS nodes (one pod each) every table of the pool is sharded over. Changing it "
    "moves every table online.",
    "placement": "Image, resources, GPUs, node constraints and data volume of the nodes.",
    "checkpoint": "Durability and periodic checkpoints of the nodes, for every table they hold.",
    "gpuMemory": "Memory of one GPU of a node: the tables' GPU bytes are checked against "
    "placement.gpus x this.",
    "readOnlyTokens": "The nodes also accept the read-only token (readers of inference tables).",
}
_STATUS_DESCRIPTIONS = {
    "phase": "Pending, Provisioning, Ready, Degraded, Resharding, Deleting or Failed.",
    "conditions": "SpecValid, Ready, Capacity, Resharding, Deletable.",
    "tables": "The tables placed on the pool and what each reserves per node.",
    "memory": "Bytes the tables reserve per node against the pool's memory request (and "
    "GPU memory).",
    "resharding": "A change of shards: the tables moved so far, and those whose move stopped.",
}


def _described(schema: dict[str, Any], texts: dict[str, str]) -> dict[str, Any]:
    for field, text in texts.items():
        schema["properties"][field]["description"] = text
    return schema


def pool_spec_schema() -> dict[str, Any]:
    spec = to_structural(PoolSpec.model_json_schema(by_alias=True, mode="validation"))
    return _described(spec, _SPEC_DESCRIPTIONS)


def pool_status_schema() -> dict[str, Any]:
    status = to_structural(PoolStatus.model_json_schema(by_alias=True, mode="validation"))
    status.pop("required", None)
    return _described(status, _STATUS_DESCRIPTIONS)


def build_pool_crd() -> dict[str, Any]:
    """The EmbeddingPool CustomResourceDefinition."""
    columns = [
        ("Phase", "string", ".status.phase"),
        ("Ready", "integer", ".status.readyShards"),
        ("Shards", "integer", ".spec.shards"),
        ("GPUs", "integer", ".spec.placement.gpus"),
        ("Memory", "string", ".spec.placement.resources.memory"),
        ("Reserved", "integer", ".status.memory.reservedBytes"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    names = (POOL_KIND, POOL_PLURAL, POOL_SINGULAR, POOL_SHORT_NAMES)
    schema = {"spec": pool_spec_schema(), "status": pool_status_schema()}
    return crd_object(names, columns, schema, "PS nodes that many embedding tables share.")
