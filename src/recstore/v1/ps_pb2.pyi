from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MigrationRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MIGRATION_ROLE_UNSPECIFIED: _ClassVar[MigrationRole]
    MIGRATION_ROLE_SOURCE: _ClassVar[MigrationRole]
    MIGRATION_ROLE_TARGET: _ClassVar[MigrationRole]
MIGRATION_ROLE_UNSPECIFIED: MigrationRole
MIGRATION_ROLE_SOURCE: MigrationRole
MIGRATION_ROLE_TARGET: MigrationRole

class SlotRange(_message.Message):
    __slots__ = ("start", "end", "shard")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    shard: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., shard: _Optional[int] = ...) -> None: ...

class SlotMap(_message.Message):
    __slots__ = ("epoch", "ranges")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    ranges: _containers.RepeatedCompositeFieldContainer[SlotRange]
    def __init__(self, epoch: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[SlotRange, _Mapping]]] = ...) -> None: ...

class CreateTableRequest(_message.Message):
    __slots__ = ("spec_json", "slot_map")
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    SLOT_MAP_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    slot_map: SlotMap
    def __init__(self, spec_json: _Optional[str] = ..., slot_map: _Optional[_Union[SlotMap, _Mapping]] = ...) -> None: ...

class CreateTableResponse(_message.Message):
    __slots__ = ("created", "stats")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    created: bool
    stats: TableStats
    def __init__(self, created: _Optional[bool] = ..., stats: _Optional[_Union[TableStats, _Mapping]] = ...) -> None: ...

class DropTableRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class DropTableResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("names", "tables")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    tables: _containers.RepeatedCompositeFieldContainer[TableStats]
    def __init__(self, names: _Optional[_Iterable[str]] = ..., tables: _Optional[_Iterable[_Union[TableStats, _Mapping]]] = ...) -> None: ...

class GetTableStatsRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class TableStats(_message.Message):
    __slots__ = ("table", "size", "capacity", "memory_bytes", "dtype", "dim", "spec_json", "shard_index", "num_shards", "slot_map", "engine", "conditions", "version", "migration", "client_caches")
    class EngineEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    SLOT_MAP_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CACHES_FIELD_NUMBER: _ClassVar[int]
    table: str
    size: int
    capacity: int
    memory_bytes: int
    dtype: str
    dim: int
    spec_json: str
    shard_index: int
    num_shards: int
    slot_map: SlotMap
    engine: _containers.ScalarMap[str, float]
    conditions: _containers.RepeatedCompositeFieldContainer[TableCondition]
    version: int
    migration: MigrationState
    client_caches: _containers.RepeatedCompositeFieldContainer[CacheClientStats]
    def __init__(self, table: _Optional[str] = ..., size: _Optional[int] = ..., capacity: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., dtype: _Optional[str] = ..., dim: _Optional[int] = ..., spec_json: _Optional[str] = ..., shard_index: _Optional[int] = ..., num_shards: _Optional[int] = ..., slot_map: _Optional[_Union[SlotMap, _Mapping]] = ..., engine: _Optional[_Mapping[str, float]] = ..., conditions: _Optional[_Iterable[_Union[TableCondition, _Mapping]]] = ..., version: _Optional[int] = ..., migration: _Optional[_Union[MigrationState, _Mapping]] = ..., client_caches: _Optional[_Iterable[_Union[CacheClientStats, _Mapping]]] = ...) -> None: ...

class CacheCounters(_message.Message):
    __slots__ = ("hits", "misses", "evictions", "resident_rows", "resident_bytes", "capacity_bytes")
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_ROWS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    hits: int
    misses: int
    evictions: int
    resident_rows: int
    resident_bytes: int
    capacity_bytes: int
    def __init__(self, hits: _Optional[int] = ..., misses: _Optional[int] = ..., evictions: _Optional[int] = ..., resident_rows: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ...) -> None: ...

class CacheClientStats(_message.Message):
    __slots__ = ("client", "layer", "policy", "counters", "reported_unix", "tier")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    REPORTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    client: str
    layer: str
    policy: str
    counters: CacheCounters
    reported_unix: float
    tier: str
    def __init__(self, client: _Optional[str] = ..., layer: _Optional[str] = ..., policy: _Optional[str] = ..., counters: _Optional[_Union[CacheCounters, _Mapping]] = ..., reported_unix: _Optional[float] = ..., tier: _Optional[str] = ...) -> None: ...

class CacheReportRequest(_message.Message):
    __slots__ = ("table", "caches")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    CACHES_FIELD_NUMBER: _ClassVar[int]
    table: str
    caches: _containers.RepeatedCompositeFieldContainer[CacheClientStats]
    def __init__(self, table: _Optional[str] = ..., caches: _Optional[_Iterable[_Union[CacheClientStats, _Mapping]]] = ...) -> None: ...

class CacheReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MigrationState(_message.Message):
    __slots__ = ("outgoing", "sealed", "pending_changes", "importing")
    OUTGOING_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    PENDING_CHANGES_FIELD_NUMBER: _ClassVar[int]
    IMPORTING_FIELD_NUMBER: _ClassVar[int]
    outgoing: _containers.RepeatedCompositeFieldContainer[SlotRange]
    sealed: bool
    pending_changes: int
    importing: _containers.RepeatedCompositeFieldContainer[SlotRange]
    def __init__(self, outgoing: _Optional[_Iterable[_Union[SlotRange, _Mapping]]] = ..., sealed: _Optional[bool] = ..., pending_changes: _Optional[int] = ..., importing: _Optional[_Iterable[_Union[SlotRange, _Mapping]]] = ...) -> None: ...

class TableCondition(_message.Message):
    __slots__ = ("type", "status", "reason", "message")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: bool
    reason: str
    message: str
    def __init__(self, type: _Optional[str] = ..., status: _Optional[bool] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("table", "epoch", "keys", "read_only", "value_dtype")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    VALUE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    table: str
    epoch: int
    keys: bytes
    read_only: bool
    value_dtype: str
    def __init__(self, table: _Optional[str] = ..., epoch: _Optional[int] = ..., keys: _Optional[bytes] = ..., read_only: _Optional[bool] = ..., value_dtype: _Optional[str] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("values", "dim", "dtype", "found", "version")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    values: bytes
    dim: int
    dtype: str
    found: bytes
    version: int
    def __init__(self, values: _Optional[bytes] = ..., dim: _Optional[int] = ..., dtype: _Optional[str] = ..., found: _Optional[bytes] = ..., version: _Optional[int] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("table", "epoch", "keys", "values", "dtype", "dim")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    table: str
    epoch: int
    keys: bytes
    values: bytes
    dtype: str
    dim: int
    def __init__(self, table: _Optional[str] = ..., epoch: _Optional[int] = ..., keys: _Optional[bytes] = ..., values: _Optional[bytes] = ..., dtype: _Optional[str] = ..., dim: _Optional[int] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    def __init__(self, rows: _Optional[int] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("table", "epoch", "keys", "grads", "grad_dtype", "lr", "dim", "request_id")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    GRAD_DTYPE_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    table: str
    epoch: int
    keys: bytes
    grads: bytes
    grad_dtype: str
    lr: float
    dim: int
    request_id: UpdateRequestId
    def __init__(self, table: _Optional[str] = ..., epoch: _Optional[int] = ..., keys: _Optional[bytes] = ..., grads: _Optional[bytes] = ..., grad_dtype: _Optional[str] = ..., lr: _Optional[float] = ..., dim: _Optional[int] = ..., request_id: _Optional[_Union[UpdateRequestId, _Mapping]] = ...) -> None: ...

class UpdateRequestId(_message.Message):
    __slots__ = ("client", "seq")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    client: str
    seq: int
    def __init__(self, client: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    def __init__(self, rows: _Optional[int] = ...) -> None: ...

class MultiPullRequest(_message.Message):
    __slots__ = ("items", "updates", "request_id")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PullRequest]
    updates: _containers.RepeatedCompositeFieldContainer[UpdateRequest]
    request_id: UpdateRequestId
    def __init__(self, items: _Optional[_Iterable[_Union[PullRequest, _Mapping]]] = ..., updates: _Optional[_Iterable[_Union[UpdateRequest, _Mapping]]] = ..., request_id: _Optional[_Union[UpdateRequestId, _Mapping]] = ...) -> None: ...

class MultiPullResponse(_message.Message):
    __slots__ = ("items", "updates")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PullResponse]
    updates: _containers.RepeatedCompositeFieldContainer[UpdateResponse]
    def __init__(self, items: _Optional[_Iterable[_Union[PullResponse, _Mapping]]] = ..., updates: _Optional[_Iterable[_Union[UpdateResponse, _Mapping]]] = ...) -> None: ...

class MultiUpdateRequest(_message.Message):
    __slots__ = ("items", "request_id")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[UpdateRequest]
    request_id: UpdateRequestId
    def __init__(self, items: _Optional[_Iterable[_Union[UpdateRequest, _Mapping]]] = ..., request_id: _Optional[_Union[UpdateRequestId, _Mapping]] = ...) -> None: ...

class MultiUpdateResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[UpdateResponse]
    def __init__(self, items: _Optional[_Iterable[_Union[UpdateResponse, _Mapping]]] = ...) -> None: ...

class SaveRequest(_message.Message):
    __slots__ = ("checkpoint_id", "tables")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint_id: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("checkpoint_id", "path", "sequence", "created_unix", "tables", "rows", "bytes")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    path: str
    sequence: int
    created_unix: float
    tables: _containers.RepeatedScalarFieldContainer[str]
    rows: int
    bytes: int
    def __init__(self, checkpoint_id: _Optional[str] = ..., path: _Optional[str] = ..., sequence: _Optional[int] = ..., created_unix: _Optional[float] = ..., tables: _Optional[_Iterable[str]] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class SaveResponse(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointInfo
    def __init__(self, checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class LoadResponse(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointInfo
    def __init__(self, checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ...) -> None: ...

class RecoverTableRequest(_message.Message):
    __slots__ = ("table", "accept_log_loss")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_LOG_LOSS_FIELD_NUMBER: _ClassVar[int]
    table: str
    accept_log_loss: bool
    def __init__(self, table: _Optional[str] = ..., accept_log_loss: _Optional[bool] = ...) -> None: ...

class DroppedLogSegment(_message.Message):
    __slots__ = ("generation", "offset", "bytes", "writes")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    generation: int
    offset: int
    bytes: int
    writes: int
    def __init__(self, generation: _Optional[int] = ..., offset: _Optional[int] = ..., bytes: _Optional[int] = ..., writes: _Optional[int] = ...) -> None: ...

class RecoverTableResponse(_message.Message):
    __slots__ = ("table", "how", "damage", "replayed_records", "dropped", "quarantine")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    HOW_FIELD_NUMBER: _ClassVar[int]
    DAMAGE_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    QUARANTINE_FIELD_NUMBER: _ClassVar[int]
    table: str
    how: str
    damage: str
    replayed_records: int
    dropped: _containers.RepeatedCompositeFieldContainer[DroppedLogSegment]
    quarantine: str
    def __init__(self, table: _Optional[str] = ..., how: _Optional[str] = ..., damage: _Optional[str] = ..., replayed_records: _Optional[int] = ..., dropped: _Optional[_Iterable[_Union[DroppedLogSegment, _Mapping]]] = ..., quarantine: _Optional[str] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class MigrateBeginRequest(_message.Message):
    __slots__ = ("table", "role", "slots")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    table: str
    role: MigrationRole
    slots: _containers.RepeatedCompositeFieldContainer[SlotRange]
    def __init__(self, table: _Optional[str] = ..., role: _Optional[_Union[MigrationRole, str]] = ..., slots: _Optional[_Iterable[_Union[SlotRange, _Mapping]]] = ...) -> None: ...

class MigrateBeginResponse(_message.Message):
    __slots__ = ("snapshot_rows",)
    SNAPSHOT_ROWS_FIELD_NUMBER: _ClassVar[int]
    snapshot_rows: int
    def __init__(self, snapshot_rows: _Optional[int] = ...) -> None: ...

class MigrateRowsRequest(_message.Message):
    __slots__ = ("table", "changes", "offset", "max_rows")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    table: str
    changes: bool
    offset: int
    max_rows: int
    def __init__(self, table: _Optional[str] = ..., changes: _Optional[bool] = ..., offset: _Optional[int] = ..., max_rows: _Optional[int] = ...) -> None: ...

class MigrationRows(_message.Message):
    __slots__ = ("keys", "values", "state", "rows", "dtype", "dim", "state_width", "gone_keys", "tail", "present_keys", "next_offset", "dedup_entries", "dedup_entry_count", "checksums")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    STATE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    GONE_KEYS_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    PRESENT_KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DEDUP_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    DEDUP_ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    keys: bytes
    values: bytes
    state: bytes
    rows: int
    dtype: str
    dim: int
    state_width: int
    gone_keys: bytes
    tail: bool
    present_keys: bytes
    next_offset: int
    dedup_entries: bytes
    dedup_entry_count: int
    checksums: SlotChecksumsResponse
    def __init__(self, keys: _Optional[bytes] = ..., values: _Optional[bytes] = ..., state: _Optional[bytes] = ..., rows: _Optional[int] = ..., dtype: _Optional[str] = ..., dim: _Optional[int] = ..., state_width: _Optional[int] = ..., gone_keys: _Optional[bytes] = ..., tail: _Optional[bool] = ..., present_keys: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., dedup_entries: _Optional[bytes] = ..., dedup_entry_count: _Optional[int] = ..., checksums: _Optional[_Union[SlotChecksumsResponse, _Mapping]] = ...) -> None: ...

class SealSlotsRequest(_message.Message):
    __slots__ = ("table", "timeout_seconds", "with_checksums")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WITH_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    table: str
    timeout_seconds: float
    with_checksums: bool
    def __init__(self, table: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., with_checksums: _Optional[bool] = ...) -> None: ...

class MigrateImportRequest(_message.Message):
    __slots__ = ("table", "rows", "with_checksums")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    WITH_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    table: str
    rows: MigrationRows
    with_checksums: bool
    def __init__(self, table: _Optional[str] = ..., rows: _Optional[_Union[MigrationRows, _Mapping]] = ..., with_checksums: _Optional[bool] = ...) -> None: ...

class MigrateImportResponse(_message.Message):
    __slots__ = ("rows", "checksums")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    checksums: SlotChecksumsResponse
    def __init__(self, rows: _Optional[int] = ..., checksums: _Optional[_Union[SlotChecksumsResponse, _Mapping]] = ...) -> None: ...

class MigrateAbortRequest(_message.Message):
    __slots__ = ("table", "role")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    role: MigrationRole
    def __init__(self, table: _Optional[str] = ..., role: _Optional[_Union[MigrationRole, str]] = ...) -> None: ...

class MigrateAbortResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: bool
    def __init__(self, aborted: _Optional[bool] = ...) -> None: ...

class MigrateCleanupRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class MigrateCleanupResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    def __init__(self, rows: _Optional[int] = ...) -> None: ...

class SlotChecksumsRequest(_message.Message):
    __slots__ = ("table", "slots")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    table: str
    slots: _containers.RepeatedCompositeFieldContainer[SlotRange]
    def __init__(self, table: _Optional[str] = ..., slots: _Optional[_Iterable[_Union[SlotRange, _Mapping]]] = ...) -> None: ...

class SlotChecksumsResponse(_message.Message):
    __slots__ = ("slots", "rows", "checksums")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    slots: bytes
    rows: bytes
    checksums: bytes
    def __init__(self, slots: _Optional[bytes] = ..., rows: _Optional[bytes] = ..., checksums: _Optional[bytes] = ...) -> None: ...

class SetSlotMapRequest(_message.Message):
    __slots__ = ("table", "expected_epoch", "slot_map", "checksum_slots")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SLOT_MAP_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    table: str
    expected_epoch: int
    slot_map: SlotMap
    checksum_slots: _containers.RepeatedCompositeFieldContainer[SlotRange]
    def __init__(self, table: _Optional[str] = ..., expected_epoch: _Optional[int] = ..., slot_map: _Optional[_Union[SlotMap, _Mapping]] = ..., checksum_slots: _Optional[_Iterable[_Union[SlotRange, _Mapping]]] = ...) -> None: ...

class SetSlotMapResponse(_message.Message):
    __slots__ = ("changed", "checksums", "held_seconds")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    HELD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    checksums: SlotChecksumsResponse
    held_seconds: float
    def __init__(self, changed: _Optional[bool] = ..., checksums: _Optional[_Union[SlotChecksumsResponse, _Mapping]] = ..., held_seconds: _Optional[float] = ...) -> None: ...

class ExportRowsRequest(_message.Message):
    __slots__ = ("table", "epoch", "with_state", "slot_mask", "max_chunk_bytes", "keys")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    WITH_STATE_FIELD_NUMBER: _ClassVar[int]
    SLOT_MASK_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    table: str
    epoch: int
    with_state: bool
    slot_mask: bytes
    max_chunk_bytes: int
    keys: bytes
    def __init__(self, table: _Optional[str] = ..., epoch: _Optional[int] = ..., with_state: _Optional[bool] = ..., slot_mask: _Optional[bytes] = ..., max_chunk_bytes: _Optional[int] = ..., keys: _Optional[bytes] = ...) -> None: ...

class ExportRowsChunk(_message.Message):
    __slots__ = ("table", "epoch", "keys", "values", "state", "dtype", "dim", "state_width", "optimizer_step")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    STATE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STEP_FIELD_NUMBER: _ClassVar[int]
    table: str
    epoch: int
    keys: bytes
    values: bytes
    state: bytes
    dtype: str
    dim: int
    state_width: int
    optimizer_step: int
    def __init__(self, table: _Optional[str] = ..., epoch: _Optional[int] = ..., keys: _Optional[bytes] = ..., values: _Optional[bytes] = ..., state: _Optional[bytes] = ..., dtype: _Optional[str] = ..., dim: _Optional[int] = ..., state_width: _Optional[int] = ..., optimizer_step: _Optional[int] = ...) -> None: ...

class ImportRowsResponse(_message.Message):
    __slots__ = ("rows", "chunks")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    chunks: int
    def __init__(self, rows: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...
