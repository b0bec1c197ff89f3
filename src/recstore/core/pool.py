"""An EmbeddingPool: a fleet of PS nodes that the tables of a model share.

A model has dozens to hundreds of tables; a fleet per table would be as many
StatefulSets, processes and GPUs, most of them idle, and a training step would
send one request per table instead of one per node. A pool is the unit of
pods, GPUs, capacity and resharding; a table placed on it (``spec.pool``) keeps
its own spec, slot map, epoch and checkpoints. This module holds the pool's
declared spec and its status (the CRD's schemas are generated from both) and how
a table's declaration becomes the one its pool's nodes host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, ValidationError, model_validator
from typing_extensions import Self

from recstore.core.errors import InvalidArgument
from recstore.core.fleet import Fleet
from recstore.core.placement import Placement, Quantity
from recstore.core.spec import MAX_SHARDS, Checkpoint, StorageTier, WireModel, describe_errors
from recstore.core.status import FleetStatus

#: a pool's name names its StatefulSet, Service and pods: a DNS label
POOL_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class PoolSpec(WireModel):
    """The fleet, as a user declares it: the nodes every table of the pool is sharded over."""

    #: PS nodes (one pod each); changing it moves every table of the pool online
    shards: Annotated[int, Field(ge=1, le=MAX_SHARDS)] = 1
    #: image, resources, GPUs, node constraints, data volume and grace of the nodes
    placement: Placement = Placement()
    #: durability and periodic checkpoints: node-wide, so the pool's for all its tables
    checkpoint: Checkpoint = Checkpoint()
    #: memory of one GPU of a node: the tables' GPU bytes are checked against gpus x this
    gpu_memory: Quantity | None = None
    #: the nodes accept the read-only token too (readers of the pool's inference tables)
    read_only_tokens: bool = False

    @model_validator(mode="after")
    def _gpu_memory_needs_gpus(self) -> Self:
        if self.gpu_memory is not None and self.placement.gpus == 0:
            raise ValueError("gpuMemory applies to a pool with placement.gpus >= 1")
        return self

    @property
    def fleet(self) -> Fleet:
        return Fleet(
            shards=self.shards,
            placement=self.placement,
            checkpoint=self.checkpoint,
            gpu=self.placement.gpus > 0,
            read_only_tokens=self.read_only_tokens,
        )


def parse_pool(data: Mapping[str, Any]) -> PoolSpec:
    """Validate a declared pool (the CR ``spec``); InvalidArgument naming every bad field."""
    try:
        return PoolSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidArgument("; ".join(describe_errors(exc, "spec"))) from None


def table_problem_on(pool: str, spec: PoolSpec, table_tier: StorageTier) -> str | None:
    """Why a table of ``table_tier`` cannot run on the pool (None when it can)."""
    if table_tier != StorageTier.host and spec.placement.gpus == 0:
        return (
            f"spec.storage: tier {table_tier.value!r} needs GPUs, and pool {pool!r} has none "
            "(its placement.gpus is 0)"
        )
    return None


def checkpoint_problem(pool: str, pool_spec: PoolSpec, declared: Checkpoint) -> str | None:
    """A table on a pool is checkpointed by the pool's nodes: its own ``checkpoint`` must be
    left out (the defaults) or the pool's."""
    if declared in (Checkpoint(), pool_spec.checkpoint):
        return None
    return (
        f"spec.checkpoint: the nodes of pool {pool!r} checkpoint every table they hold "
        f"({pool_spec.checkpoint.to_wire()}); leave it out or declare the pool's"
    )


class PoolTable(WireModel):
    """One table placed on the pool, and what it reserves on each node."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    #: the table's phase, as its own status says
    phase: str | None = None
    #: the nodes its slot map spreads it over (the pool's, once any move ended)
    shards: Annotated[int, Field(ge=1, le=MAX_SHARDS)] | None = None
    #: host memory it reserves on each node: rows, optimizer state, index, bookkeeping
    memory_bytes: Annotated[int, Field(ge=0)] = 0
    #: GPU memory it reserves on each node (rows of a gpu table, a gpu_cache table's cache)
    gpu_memory_bytes: Annotated[int, Field(ge=0)] = 0
    #: it fits: placed on the nodes (False: refused for capacity, nothing created)
    placed: bool = True


class PoolMemory(WireModel):
    """The tables' reservation on one node against what the pool asks for it."""

    request_bytes: Annotated[int, Field(ge=0)]
    #: the node process's own share of the request, before any table
    node_bytes: Annotated[int, Field(ge=0)]
    reserved_bytes: Annotated[int, Field(ge=0)]
    gpu_request_bytes: Annotated[int, Field(ge=0)] | None = None
    gpu_reserved_bytes: Annotated[int, Field(ge=0)] = 0


class PoolResharding(WireModel):
    """A change of the pool's shards: how far its tables have moved."""

    from_shards: Annotated[int, Field(ge=1, le=MAX_SHARDS)]
    to_shards: Annotated[int, Field(ge=1, le=MAX_SHARDS)]
    tables_moved: Annotated[int, Field(ge=0)]
    tables_total: Annotated[int, Field(ge=0)]
    #: tables whose move stopped (rolled back to where they were; retried)
    failed: list[str] = Field(default_factory=list)


class PoolStatus(FleetStatus):
    """What runs for a pool, what it holds and how a change of its shards goes."""

    tables: list[PoolTable] = Field(default_factory=list)
    memory: PoolMemory | None = None
    resharding: PoolResharding | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
