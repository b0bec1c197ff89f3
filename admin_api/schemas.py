"""Request and response bodies: Create / Update / Public schemas per entity.

Tables are declared with the shared ``recstore.core.TableSpec`` and report their
status as the shared ``recstore.core.status.TableStatus`` (the EmbeddingTable CR's
status, so it is camelCase like Kubernetes); this module adds what the catalogue
keeps around them. Everything else is snake_case.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from recstore.admin.security import Role
from recstore.core.pool import POOL_NAME, PoolSpec
from recstore.core.spec import MAX_SHARDS, TableSpec
from recstore.core.status import TableStatus, validate_endpoint

T = TypeVar("T")

_METRICS_URL = re.compile(r"^https?://[^\s/]+(/[^\s]*)?$")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


# --- tables -----------------------------------------------------------------


class TableCreate(TableSpec):
    """A TableSpec, and the EmbeddingPool whose nodes hold the table (none: its own)."""

    #: a table on a pool takes its shards from the pool: it may not declare them
    pool: Annotated[str, Field(min_length=1, max_length=63)] | None = None

    def table_spec(self) -> TableSpec:
        return TableSpec.model_validate(self.model_dump(exclude={"pool"}, exclude_unset=True))


class TablePatch(BaseModel):
    """A partial TableSpec (snake_case or camelCase) plus the version it was read at."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    num_embeddings: int | None = None
    embedding_dim: int | None = None
    dtype: str | None = None
    shards: int | None = None
    keys: dict[str, Any] | None = None
    initializer: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    storage: str | None = None
    gpu_cache: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    non_finite: str | None = None
    mode: str | None = None
    transport_dtype: str | None = None
    name: str | None = None
    resource_version: str | int | None = None

    def spec_changes(self) -> dict[str, Any]:
        """The spec fields the caller set (snake_case keys), without the version."""
        return self.model_dump(exclude_unset=True, exclude={"resource_version"})


class TablePublic(BaseModel):
    name: str
    spec: dict[str, Any]  # TableSpec in camelCase wire form
    #: the EmbeddingPool whose nodes hold the table (null: a fleet of its own)
    pool: str | None = None
    generation: int
    resource_version: int
    #: as reported, less the slot map (discovery serves it); readyShards counted here
    status: TableStatus
    #: The catalogue's shard count differs from the running slot map's.
    reshard_required: bool
    rows: int
    memory_bytes: int
    created_by: str
    created_at: datetime
    updated_at: datetime


class SlotMapPublic(BaseModel):
    epoch: int
    ranges: list[list[int]]


class Discovery(BaseModel):
    """What the SDK needs to reach a table: shape and shard endpoints in shard order."""

    name: str
    spec: dict[str, Any]
    dtype: str
    embedding_dim: int
    num_embeddings: int
    shards: int
    slot_map: SlotMapPublic
    endpoints: list[str]


# --- pools -------------------------------------------------------------------


class PoolCreate(PoolSpec):
    """A PoolSpec (camelCase, as the EmbeddingPool's ``spec``) and the pool's name."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=POOL_NAME.pattern)]

    def pool_spec(self) -> PoolSpec:
        return PoolSpec.model_validate(self.model_dump(exclude={"name"}, exclude_unset=True))


class PoolPatch(BaseModel):
    """A partial PoolSpec (snake_case or camelCase) plus the version it was read at."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    shards: int | None = None
    placement: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    gpu_memory: str | None = None
    read_only_tokens: bool | None = None
    resource_version: str | int | None = None

    def spec_changes(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True, exclude={"resource_version"})


class PoolPublic(BaseModel):
    name: str
    spec: dict[str, Any]  # PoolSpec in camelCase wire form
    generation: int
    resource_version: int
    phase: str
    #: as the provisioner reported it (``recstore.core.pool.PoolStatus``); null before
    status: dict[str, Any] | None
    #: the catalogue's tables that name the pool, by name
    tables: list[str]
    created_by: str
    created_at: datetime
    updated_at: datetime


# --- caches (recstore.core.cache_figures, read live from the nodes) ---------


class CacheFiguresPublic(BaseModel):
    hits: int
    misses: int
    evictions: int
    resident_rows: int
    resident_bytes: int
    capacity_bytes: int
    hit_rate: float


class ShardCachePublic(BaseModel):
    index: int
    #: the engine's GPU cache on this shard (gpu_cache tables), else null
    engine: CacheFiguresPublic | None
    #: why this shard's figures could not be read, else null
    error: str | None


class ClientCachePublic(CacheFiguresPublic):
    client: str  # host:pid:role of the reporting process
    layer: str
    tier: str  # host | gpu (recstore.core.cache_figures.TIERS)
    policy: str
    reported_unix: float


class TableCachePublic(BaseModel):
    shards: list[ShardCachePublic]
    engine_total: CacheFiguresPublic | None
    #: caches in trainer processes, each tier of each layer from its newest report
    clients: list[ClientCachePublic]
    #: per tier (only tiers that reported): the sum of the clients' caches of that tier
    clients_total: dict[str, CacheFiguresPublic]


# --- nodes ------------------------------------------------------------------


class NodeRegister(BaseModel):
    model_config = ConfigDict(extra="forbid")

    table: Annotated[str, Field(min_length=1, max_length=63)]
    shard_index: Annotated[int, Field(ge=0, le=1023)]
    endpoint: Annotated[str, Field(max_length=255)]
    metrics_endpoint: Annotated[str, Field(max_length=255)] | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return validate_endpoint(value)

    @field_validator("metrics_endpoint")
    @classmethod
    def _metrics(cls, value: str | None) -> str | None:
        if value is None or _METRICS_URL.fullmatch(value):
            return value
        return validate_endpoint(value)


class NodeHeartbeat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ready: bool
    rows: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    memory_bytes: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0


class NodePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    table: str
    shard_index: int
    endpoint: str
    metrics_endpoint: str | None
    ready: bool
    rows: int
    memory_bytes: int
    registered_at: datetime
    last_heartbeat: datetime | None
    registered_by: str | None = None
    #: Registered by the provisioner identity (only such nodes are dialled or scraped).
    provisioned: bool = False


# --- checkpoints, events, tokens ----------------------------------------------


class CheckpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: Annotated[str, Field(max_length=200)] | None = None


class CheckpointPublic(BaseModel):
    id: int
    table: str
    state: str
    requested_by: str
    requested_at: datetime
    completed_at: datetime | None
    detail: Any = None


# --- a refused table recovered (`recstore recover`) ----------------------------


_Count = Annotated[int, Field(ge=0)]
_Text = Annotated[str, Field(max_length=4000)]


class DroppedLogBody(BaseModel):
    """What an accepted log loss cut from one segment (``recstore.core.proto_convert``)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    generation: _Count
    offset: _Count
    bytes: _Count
    writes: _Count


class ShardRecovery(BaseModel):
    """One node's answer to RecoverTable: recovered (how, what it dropped) or failed (why)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    shard: Annotated[int, Field(ge=0, le=MAX_SHARDS)]
    endpoint: Annotated[str, Field(max_length=300)]
    outcome: Literal["recovered", "failed"]
    error: _Text = ""
    table: Annotated[str, Field(max_length=63)] = ""
    how: _Text = ""
    damage: _Text = ""
    replayed_records: _Count = 0
    dropped: Annotated[list[DroppedLogBody], Field(max_length=100_000)] = []
    writes_dropped: _Count = 0
    quarantine: _Text = ""


class TableRecoveryReport(BaseModel):
    """An operator's recovery of a refused table and what each node did (the audit record)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    table: Annotated[str, Field(max_length=63)]
    accept_log_loss: bool
    shards: Annotated[list[ShardRecovery], Field(min_length=1, max_length=MAX_SHARDS)]


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    actor: str
    action: str
    resource_type: str
    resource_name: str
    table_name: str | None
    before: Any = None
    after: Any = None


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w .@-]*$")]
    role: Role = Role.viewer


class TokenPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    role: Role
    prefix: str
    created_by: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(TokenPublic):
    #: The secret itself: returned by this response only, never again.
    token: str
