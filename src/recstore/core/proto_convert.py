"""Conversions between the gRPC control-plane messages and the core types.

The only place that turns a ``SlotMap``, a ``TableSpec``, table stats, a
checkpoint or a token into ``recstore.v1.ps_pb2`` messages (or gRPC metadata)
and back; the PS node, the provisioners and the SDK all call these. A field a
reply leaves unset reads as None (an empty slot map, an empty ``spec_json``);
a field that is set but malformed raises ``InvalidArgument`` (or the
``ValueError`` of the core type's own validation), and bytes that are not the
message at all ``MalformedMessage`` (``read_message``). The data path (Pull,
Push, Update) has its own zero-copy codec, ``recstore.core.wire``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from google.protobuf.message import DecodeError, Message

from recstore.core import strict_json
from recstore.core.cache_figures import (
    CacheFigures,
    ClientCache,
    client_cache_from_proto,
    client_cache_to_proto,
    engine_figures,
)
from recstore.core.errors import InvalidArgument, MalformedMessage
from recstore.core.routing import SlotMap, SlotRange
from recstore.core.spec import TableSpec
from recstore.v1 import ps_pb2

#: gRPC metadata: (key, value) pairs.
Metadata = tuple[tuple[str, str], ...]
M = TypeVar("M", bound=Message)
AUTHORIZATION = "authorization"
BEARER = "Bearer"


# -- messages ---------------------------------------------------------------------
def read_message(message_type: type[M], data: bytes) -> M:
    """``data`` parsed as a ``message_type``; MalformedMessage when it is not one."""
    try:
        return message_type.FromString(data)
    except DecodeError as error:
        name = message_type.DESCRIPTOR.full_name
        reason = str(error).removeprefix(f"Error parsing message with type '{name}': ")
        raise MalformedMessage(f"malformed {name} ({len(data)} bytes): {reason}") from None


# -- tokens -----------------------------------------------------------------------
def bearer_metadata(token: str | None) -> Metadata:
    """The metadata that carries ``token`` (``authorization: Bearer <token>``); none without."""
    return ((AUTHORIZATION, f"{BEARER} {token}"),) if token else ()


def bearer_token_of(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of the first ``authorization`` entry when it is a bearer token, else None."""
    for key, value in metadata or ():
        if key == AUTHORIZATION:
            scheme, _, given = str(value).partition(" ")
            return given.strip() if scheme.lower() == BEARER.lower() else None
    return None


# -- slot maps --------------------------------------------------------------------
def slot_map_to_proto(slot_map: SlotMap) -> ps_pb2.SlotMap:
    ranges = [ps_pb2.SlotRange(start=r.start, end=r.end, shard=r.shard) for r in slot_map.ranges]
    return ps_pb2.SlotMap(epoch=slot_map.epoch, ranges=ranges)


def slot_map_from_proto(message: ps_pb2.SlotMap) -> SlotMap:
    """The slot map of ``message``; ValueError unless its ranges tile every slot."""
    ranges = tuple(SlotRange(int(r.start), int(r.end), int(r.shard)) for r in message.ranges)
    return SlotMap(epoch=int(message.epoch), ranges=ranges)


def slot_map_from_proto_or_none(message: ps_pb2.SlotMap) -> SlotMap | None:
    """As ``slot_map_from_proto``; None for a message without ranges (an unset field)."""
    return slot_map_from_proto(message) if message.ranges else None


# -- table specs ------------------------------------------------------------------
def spec_to_json(spec: TableSpec) -> str:
    """The ``spec_json`` field of a spec (its wire form, ``TableSpec.to_wire()``)."""
    return json.dumps(spec.to_wire())


def spec_from_json(text: str) -> TableSpec:
    """The spec of a ``spec_json`` field: InvalidArgument when it is not strict JSON
    (``recstore.core.strict_json``: no NaN or infinity, bounded nesting), the pydantic
    ValidationError (a ValueError) when it is not a valid spec."""
    try:
        data = strict_json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgument(f"spec_json is not JSON: {error}") from None
    return TableSpec.model_validate(data)


def create_table_request(
    spec: TableSpec, slot_map: SlotMap | None = None
) -> ps_pb2.CreateTableRequest:
    """CreateTable of ``spec``; without ``slot_map`` the node starts the table's initial map."""
    request = ps_pb2.CreateTableRequest(spec_json=spec_to_json(spec))
    if slot_map is not None:
        request.slot_map.CopyFrom(slot_map_to_proto(slot_map))
    return request


def read_create_table_request(
    request: ps_pb2.CreateTableRequest,
) -> tuple[TableSpec, SlotMap | None]:
    """(spec, slot map or None when unset) of a CreateTable request."""
    slot_map = slot_map_from_proto(request.slot_map) if request.HasField("slot_map") else None
    return spec_from_json(request.spec_json), slot_map


# -- table stats ------------------------------------------------------------------
@dataclass(frozen=True)
class TableCondition:
    """One condition of a table on a node (``type``, ``status``, ``reason``, ``message``)."""

    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class TableStats:
    """What one shard reports about a table (``GetTableStats``, ``CreateTable``)."""

    table: str
    size: int  # rows held by this shard
    capacity: int  # rows this shard may hold
    memory_bytes: int
    dtype: str
    dim: int
    spec: TableSpec | None  # None when the reply carries no spec
    shard_index: int
    num_shards: int
    slot_map: SlotMap | None  # None when the reply carries no slot map
    engine: Mapping[str, float] = field(default_factory=dict)  # the engine's own counters
    conditions: Sequence[TableCondition] = ()  # what the node wants an operator to know
    version: int = 0  # the table's version on this node: moves on every write
    #: host caches trainers hold in front of the table, as last reported (CacheReport)
    client_caches: Sequence[ClientCache] = ()

    @property
    def engine_cache(self) -> CacheFigures | None:
        """The engine's GPU cache (a gpu_cache table), else None."""
        return engine_figures(self.engine)


#: TableStats fields the message carries as they are (the rest are converted)
_PLAIN_STATS_FIELDS = (
    "table", "size", "capacity", "memory_bytes", "dtype", "dim", "shard_index", "num_shards",
    "version",
)  # fmt: skip


def table_stats_to_proto(stats: TableStats) -> ps_pb2.TableStats:
    message = ps_pb2.TableStats(
        **{name: getattr(stats, name) for name in _PLAIN_STATS_FIELDS},
        spec_json=spec_to_json(stats.spec) if stats.spec is not None else "",
        engine={k: float(v) for k, v in stats.engine.items()},
        conditions=[ps_pb2.TableCondition(**vars(c)) for c in stats.conditions],
        client_caches=[client_cache_to_proto(c) for c in stats.client_caches],
    )
    if stats.slot_map is not None:
        message.slot_map.CopyFrom(slot_map_to_proto(stats.slot_map))
    return message


def table_stats_from_proto(message: ps_pb2.TableStats) -> TableStats:
    return TableStats(
        **{name: getattr(message, name) for name in _PLAIN_STATS_FIELDS},
        spec=spec_from_json(message.spec_json) if message.spec_json else None,
        slot_map=slot_map_from_proto_or_none(message.slot_map),
        engine=dict(message.engine),
        conditions=tuple(
            TableCondition(c.type, c.status, c.reason, c.message) for c in message.conditions
        ),
        client_caches=tuple(client_cache_from_proto(c) for c in message.client_caches),
    )


# -- checkpoints ------------------------------------------------------------------
class CheckpointFields(Protocol):
    """What a checkpoint record carries on the wire (the node's CheckpointInfo has more)."""

    @property
    def checkpoint_id(self) -> str: ...
    @property
    def path(self) -> object: ...  # a str or a Path; sent as str
    @property
    def sequence(self) -> int: ...
    @property
    def created_unix(self) -> float: ...
    @property
    def tables(self) -> Sequence[str]: ...
    @property
    def rows(self) -> int: ...
    @property
    def bytes(self) -> int: ...


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint as a node reports it (Save, Load, ListCheckpoints)."""

    checkpoint_id: str
    path: str
    sequence: int
    created_unix: float
    tables: tuple[str, ...]
    rows: int
    bytes: int


#: checkpoint fields the message carries as they are (path and tables are converted)
_PLAIN_CHECKPOINT_FIELDS = ("checkpoint_id", "sequence", "created_unix", "rows", "bytes")


def checkpoint_to_proto(
    info: CheckpointFields, *, root: Path | None = None
) -> ps_pb2.CheckpointInfo:
    """``root``: send the path relative to it (a node never tells callers its own layout)."""
    path = str(info.path)
    if root is not None:
        full = Path(path)
        path = str(full.relative_to(root) if full.is_relative_to(root) else full.name)
    return ps_pb2.CheckpointInfo(
        **{name: getattr(info, name) for name in _PLAIN_CHECKPOINT_FIELDS},
        path=path,
        tables=list(info.tables),
    )


def checkpoint_from_proto(message: ps_pb2.CheckpointInfo) -> SavedCheckpoint:
    return SavedCheckpoint(
        **{name: getattr(message, name) for name in _PLAIN_CHECKPOINT_FIELDS},
        path=message.path,
        tables=tuple(message.tables),
    )


# -- a refused table recovered (RecoverTable) -----------------------------------------
@dataclass(frozen=True)
class DroppedLog:
    """What an accepted log loss cut from one segment: ``bytes`` from ``offset`` on."""

    generation: int
    offset: int
    bytes: int
    writes: int  # intact write records among them (a damaged one is not counted)


@dataclass(frozen=True)
class TableRecovery:
    """How a node brought a refused table back and, a log loss accepted, what it dropped."""

    table: str
    how: str
    damage: str = ""  # where the log was damaged (empty: nothing was dropped)
    replayed_records: int = 0  # records of the log's intact prefix
    dropped: tuple[DroppedLog, ...] = ()
    quarantine: str = ""  # where copies of the dropped segments lie, under the data dir

    @property
    def writes_dropped(self) -> int:
        return sum(d.writes for d in self.dropped)


_DROPPED_FIELDS = ("generation", "offset", "bytes", "writes")
_RECOVERY_FIELDS = ("table", "how", "damage", "replayed_records", "quarantine")


def recovery_to_proto(recovery: TableRecovery) -> ps_pb2.RecoverTableResponse:
    return ps_pb2.RecoverTableResponse(
        **{name: getattr(recovery, name) for name in _RECOVERY_FIELDS},
        dropped=[
            ps_pb2.DroppedLogSegment(**{name: getattr(d, name) for name in _DROPPED_FIELDS})
            for d in recovery.dropped
        ],
    )


def recovery_from_proto(message: ps_pb2.RecoverTableResponse) -> TableRecovery:
    return TableRecovery(
        **{name: getattr(message, name) for name in _RECOVERY_FIELDS},
        dropped=tuple(
            DroppedLog(**{name: getattr(d, name) for name in _DROPPED_FIELDS})
            for d in message.dropped
        ),
    )
