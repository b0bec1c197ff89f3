"""The status of a table: one typed model that every provisioner writes and every reader reads.

The reconcile core (``recstore.core.reconcile``) computes it; the operator writes it into
an EmbeddingTable's status subresource, whose schema in the CRD is generated from this
model (``recstore.operator.crd``, as the spec's is from ``TableSpec``); the operator and
the local provisioner report it to the admin API (``PUT /api/v1/tables/{name}/status``),
which validates it with this model, keeps it and serves it. camelCase on the wire, as
Kubernetes writes a status.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from typing_extensions import Self

from recstore.core.checkpoint_status import MESSAGE_MAX, TableCheckpoint, Timestamp
from recstore.core.spec import MAX_SHARDS, WireModel

#: host:port, host a DNS name, an IPv4 address or a bracketed IPv6 address.
_ENDPOINT = re.compile(
    r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?):(\d{1,5})$"
)
#: a generation the catalogue stores (a database integer)
GENERATION_MAX = 2**31 - 1
#: fields a reporter sends only when it has them (the slot map after a move, the operator's
#: job record): absent from a status otherwise, so a merge patch leaves the stored one be
_SENT_WHEN_SET = ("slot_map", "migration_job")
#: an object the API server keeps as it is (no schema of its fields)
_PRESERVE_UNKNOWN = "x-kubernetes-preserve-unknown-fields"


def validate_endpoint(value: str) -> str:
    """Accept ``host:port`` with a port in 1..65535; raise ValueError otherwise."""
    match = _ENDPOINT.fullmatch(value)
    if not match or not 1 <= int(match.group(3)) <= 65535:
        raise ValueError(f"endpoint must be host:port with a port in 1..65535, got {value!r}")
    return value


class Phase(str, Enum):
    pending = "Pending"  # accepted, nothing running yet
    provisioning = "Provisioning"  # shards starting or rolling to a new template
    ready = "Ready"  # every shard serves
    degraded = "Degraded"  # was ready, some shard stopped serving
    deleting = "Deleting"
    failed = "Failed"  # the declaration is invalid; nothing was changed
    resharding = "Resharding"  # every shard serves; slots are moving to a new shard count


class Condition(WireModel):
    """One aspect of the table, Kubernetes style (SpecValid, Ready, Progressing, ...)."""

    type: Annotated[str, Field(min_length=1, max_length=64)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, Field(max_length=128)] | None = None
    message: Annotated[str, Field(max_length=MESSAGE_MAX)] | None = None
    last_transition_time: Timestamp | None = None
    observed_generation: Annotated[int, Field(ge=0, le=GENERATION_MAX)] | None = None


class ShardStatus(WireModel):
    index: Annotated[int, Field(ge=0, lt=MAX_SHARDS)]
    #: where clients reach the shard (host:port)
    endpoint: Annotated[str, Field(max_length=255)] | None = None
    ready: bool = False

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return None if value is None else validate_endpoint(value)


class SlotMapStatus(WireModel):
    """A slot map (``recstore.core.routing.SlotMap.to_dict``): [start, end, shard] ranges."""

    epoch: Annotated[int, Field(ge=1)]
    ranges: list[Annotated[list[int], Field(min_length=3, max_length=3)]]


class FleetStatus(WireModel):
    """How a fleet of nodes is doing: a table's own, or a pool's (the statuses' common part)."""

    phase: Phase
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    #: the spec generation the shards were last applied for
    observed_generation: Annotated[int, Field(ge=0, le=GENERATION_MAX)] | None = None
    #: how many of ``shards`` are ready (always their count when given)
    ready_shards: Annotated[int, Field(ge=0)] | None = None
    shards: list[ShardStatus] = Field(default_factory=list)


class TableStatus(FleetStatus):
    """What runs for a table and how it is doing."""

    slot_map_epoch: Annotated[int, Field(ge=1)] | None = None
    #: the whole slot map, sent when the reporter changed ownership (an online move)
    slot_map: SlotMapStatus | None = None
    #: the newest checkpoint every shard wrote
    last_checkpoint: TableCheckpoint | None = None
    #: the newest checkpoint asked for on demand, however it went
    checkpoint_request: TableCheckpoint | None = None

    @model_validator(mode="after")
    def _ready_shards_counted(self) -> Self:
        counted = sum(s.ready for s in self.shards)
        if self.ready_shards is not None and self.ready_shards != counted:
            raise ValueError(
                f"readyShards is {self.ready_shards} but {counted} of the shards are ready"
            )
        return self

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready camelCase form. Every field is there (null clears it in a merge patch)
        but the slot map and the job record, which only the reporter that has them sends."""
        unset = {name for name in _SENT_WHEN_SET if getattr(self, name, None) is None}
        return self.model_dump(mode="json", by_alias=True, exclude=unset)

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> Self | None:
        """A stored status (a resource's, written by any version) as far as it fits the
        model: a field that does not (or that this model has not) is left out. None when
        nothing is stored or the phase itself does not fit."""
        fields = dict(data or {})
        while fields:
            try:
                return cls.model_validate(fields)
            except ValidationError as error:
                # a field's own error names it; the shards' count is the model's
                bad = {str(e["loc"][0]) if e["loc"] else "readyShards" for e in error.errors()}
                if "phase" in bad or not bad & set(fields):
                    return None
                for key in bad:
                    fields.pop(key, None)
        return None


class EmbeddingTableStatus(TableStatus):
    """The EmbeddingTable resource's status: the table's, plus the operator's record of an
    online move, which a restarted operator resumes from."""

    migration_job: Annotated[
        dict[str, Any] | None, Field(json_schema_extra={_PRESERVE_UNKNOWN: True})
    ] = None
