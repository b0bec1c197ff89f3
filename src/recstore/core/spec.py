"""The table spec: the one model every surface validates a table against.

The CRD schema, the REST API, gRPC CreateTable and the SDK all accept a table
as this model, so a spec that one surface accepts every other accepts too.
Field names are snake_case in Python and camelCase on the wire to Kubernetes
(``spec.model_dump(by_alias=True)``); both spellings are accepted on input.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from recstore.core.errors import InferenceTable

#: Table names: what a Kubernetes object name and a file name both tolerate,
#: plus underscores (the SDK's documented examples use them).
TABLE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$"

MAX_EMBEDDING_DIM = 8192
MAX_SHARDS = 1024


class WireModel(BaseModel):
    """Frozen, strict, camelCase on the wire: the base of every declared model.

    Every float of a declared model is finite: NaN and ±inf (``1e400`` reads as inf)
    are refused naming the field (``Input should be a finite number``), whatever
    surface the model came through; a NaN learning rate or initializer would
    otherwise serve NaN rows.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=True,
        allow_inf_nan=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready camelCase form (CRD spec and status, gRPC CreateTable payload, REST)."""
        return self.model_dump(mode="json", by_alias=True)


class DType(str, Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.float32 else 2


class KeyMode(str, Enum):
    dense = "dense"  # ids 0..num_embeddings-1, direct addressing
    hashed = "hashed"  # arbitrary int64 keys, fixed capacity, optional eviction


class Eviction(str, Enum):
    none = "none"  # a full table refuses new keys (RESOURCE_EXHAUSTED)
    lru = "lru"
    lfu = "lfu"


class StorageTier(str, Enum):
    gpu = "gpu"
    host = "host"
    #: rows in host memory (authoritative, written through), a GPU cache in front
    gpu_cache = "gpu_cache"


#: Share of a table's rows a gpu_cache tier caches when neither rows nor bytes is given.
DEFAULT_GPU_CACHE_FRACTION = 0.1
#: Most ways a gpu_cache set may have (csrc/cache_sets.h, kMaxCacheWays).
MAX_GPU_CACHE_WAYS = 32
#: GPU bytes of a gpu_cache slot's directory entry, beside its row (csrc/cache_table.h,
#: kCacheSlotBytes): a cache of ``bytes`` holds bytes // (row bytes + this) rows.
GPU_CACHE_SLOT_BYTES = 16


class Durability(str, Enum):
    checkpoint = "checkpoint"  # writes since the last checkpoint are lost on a crash
    wal = "wal"  # every acknowledged write is logged and fsynced before the reply


class NonFinite(str, Enum):
    """What a write does with NaN or infinite gradients and values (``nonFinite``)."""

    reject = "reject"  # the whole batch is refused (INVALID_ARGUMENT), nothing applied
    skip_rows = "skip-rows"  # rows of keys with a non-finite value are left out, the rest applied
    allow = "allow"  # written as given (a NaN row stays NaN)


class TableMode(str, Enum):
    """What a table is opened for (``mode``)."""

    training = "training"  # optimizer state per row; Update applies gradients
    inference = "inference"  # no optimizer state; Update is refused, Push loads weights


class Keys(WireModel):
    mode: KeyMode = KeyMode.dense
    #: hashed mode: rows the whole table may hold (split over the shards);
    #: defaults to num_embeddings.
    capacity: Annotated[int, Field(ge=1)] | None = None
    eviction: Eviction = Eviction.none
    #: hashed mode: rows untouched for this long may be evicted first.
    ttl_seconds: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _hashed_only(self) -> Keys:
        if self.mode == KeyMode.dense and (
            self.eviction != Eviction.none or self.ttl_seconds is not None
        ):
            raise ValueError("eviction and ttl_seconds apply to hashed keys only")
        return self


class Initializer(WireModel):
    kind: Literal["zeros", "normal", "uniform"] = "normal"
    mean: float = 0.0
    std: Annotated[float, Field(ge=0)] = 0.01
    low: float = -0.01
    high: float = 0.01
    #: initial rows are a pure function of (key, seed): every shard and every
    #: restart reproduces the same row for the same key.
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0

    @model_validator(mode="after")
    def _range(self) -> Initializer:
        if self.kind == "uniform" and not self.low < self.high:
            raise ValueError(f"uniform initializer needs low < high, got {self.low} >= {self.high}")
        return self


class Optimizer(WireModel):
    kind: Literal["sgd", "adagrad", "rowwise_adagrad", "adam"] = "sgd"
    lr: Annotated[float, Field(gt=0)] = 0.01
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    eps: Annotated[float, Field(gt=0)] = 1e-10
    initial_accumulator_value: Annotated[float, Field(ge=0)] = 0.0
    beta1: Annotated[float, Field(ge=0, lt=1)] = 0.9
    beta2: Annotated[float, Field(ge=0, lt=1)] = 0.999

    def state_fields(self, dim: int) -> tuple[tuple[str, int], ...]:
        """The per-row fp32 state, in storage order: (torch's name for it, width).

        adagrad: its accumulator; rowwise_adagrad: one accumulator per row; adam:
        exp_avg, exp_avg_sq (the step count is per table, as SparseAdam's).
        """
        if self.kind == "adagrad":
            return (("sum", dim),)
        if self.kind == "rowwise_adagrad":
            return (("sum", 1),)
        if self.kind == "adam":
            return (("exp_avg", dim), ("exp_avg_sq", dim))
        return ()

    def state_width(self, dim: int) -> int:
        """Number of fp32 state values stored per row of a ``dim``-wide table."""
        return sum(width for _, width in self.state_fields(dim))


class GpuCache(WireModel):
    """The GPU cache of ``storage: gpu_cache``: its size (whole table) and associativity."""

    #: cached rows of the whole table (split over the shards) ...
    rows: Annotated[int, Field(ge=1)] | None = None
    #: ... or GPU bytes of the cache, each cached row with its 16-byte directory entry;
    #: neither: 10% of the table's rows.
    bytes: Annotated[int, Field(ge=1)] | None = None
    #: slots per set: a key may live in any way of its set (set-associative).
    ways: Annotated[int, Field(ge=1, le=MAX_GPU_CACHE_WAYS)] = 8
    eviction: Literal["lru"] = "lru"

    @model_validator(mode="after")
    def _one_size(self) -> GpuCache:
        if self.rows is not None and self.bytes is not None:
            raise ValueError("give the cache size as rows or as bytes, not both")
        return self


class Checkpoint(WireModel):
    #: seconds between periodic checkpoints; 0 disables them.
    interval_seconds: Annotated[int, Field(ge=0)] = 0
    #: how many complete checkpoints to keep on disk.
    keep: Annotated[int, Field(ge=1, le=100)] = 3
    durability: Durability = Durability.checkpoint
    #: every how many checkpoints one is full: 1 (the default) writes every one
    #: whole; N > 1 writes one full checkpoint, then up to N - 1 incremental ones
    #: holding only the rows changed (and the keys gone) since the previous one.
    full_every: Annotated[int, Field(ge=1, le=1000)] = 1


#: Fields (paths of field names) a table keeps for life: they fix the layout of its
#: stored rows (an inference table's rows carry no optimizer state), so changing one
#: needs a new table. The admin API refuses such a change; the CRD declares each of
#: them immutable to the Kubernetes API server.
IMMUTABLE_FIELDS: tuple[tuple[str, ...], ...] = (
    ("name",),
    ("embedding_dim",),
    ("dtype",),
    ("keys", "mode"),
    ("mode",),
)


class TableSpec(WireModel):
    """One embedding table, as a user declares it."""

    name: Annotated[str, Field(pattern=TABLE_NAME_PATTERN)]
    num_embeddings: Annotated[int, Field(ge=1, le=2**62)]
    embedding_dim: Annotated[int, Field(ge=1, le=MAX_EMBEDDING_DIM)]
    dtype: DType = DType.float32
    shards: Annotated[int, Field(ge=1, le=MAX_SHARDS)] = 1
    keys: Keys = Keys()
    initializer: Initializer = Initializer()
    optimizer: Optimizer = Optimizer()
    storage: StorageTier = StorageTier.host
    #: the cache of ``storage: gpu_cache`` (defaults apply when left out).
    gpu_cache: GpuCache | None = None
    checkpoint: Checkpoint = Checkpoint()
    #: NaN / Inf in an update's gradients or a push's (or import's) values.
    non_finite: NonFinite = NonFinite.reject
    #: inference: no optimizer state is allocated (the optimizer is kept but never
    #: used) and updates are refused; pushes still assign rows (loading weights).
    mode: TableMode = TableMode.training
    #: the dtype remote pulls and updates carry rows in (None: the table dtype). A
    #: float32 table may send them as float16 or bfloat16, half the bytes; the node
    #: keeps rows, and runs the optimizer, in float32.
    transport_dtype: DType | None = None

    @model_validator(mode="after")
    def _transport(self) -> TableSpec:
        check_transport_dtype(self.dtype, self.transport_dtype)
        return self

    @property
    def wire_dtype(self) -> str:
        """The dtype rows travel in: transport_dtype, else the table dtype."""
        return DType(self.transport_dtype or self.dtype).value

    @model_validator(mode="after")
    def _gpu_cache_tier(self) -> TableSpec:
        if StorageTier(self.storage) != StorageTier.gpu_cache:
            if self.gpu_cache is not None:
                raise ValueError("gpu_cache applies to storage: gpu_cache only")
            return self
        if Eviction(self.keys.eviction) != Eviction.none or self.keys.ttl_seconds is not None:
            raise ValueError(
                "storage gpu_cache keeps every row in host memory: keys.eviction and "
                "keys.ttl_seconds do not apply to it"
            )
        size = self.cache.bytes
        slot = self.row_bytes + GPU_CACHE_SLOT_BYTES
        if size is not None and size < slot * self.shards:
            raise ValueError(
                f"gpu_cache.bytes {size} holds no row of {self.row_bytes} bytes (and its "
                f"{GPU_CACHE_SLOT_BYTES}-byte slot) on each of the {self.shards} shards"
            )
        return self

    @property
    def cache(self) -> GpuCache:
        """The gpu_cache settings in force (the defaults when none were given)."""
        return self.gpu_cache or GpuCache()

    @property
    def key_mode(self) -> KeyMode:
        return KeyMode(self.keys.mode)

    @property
    def capacity(self) -> int:
        """Rows the whole table may hold (all shards together)."""
        if self.key_mode == KeyMode.dense:
            return self.num_embeddings
        return self.keys.capacity or self.num_embeddings

    @property
    def row_bytes(self) -> int:
        return self.embedding_dim * DType(self.dtype).itemsize

    @property
    def inference(self) -> bool:
        return TableMode(self.mode) == TableMode.inference

    @property
    def state_width(self) -> int:
        """fp32 optimizer-state values stored per row: none for an inference table."""
        return 0 if self.inference else self.optimizer.state_width(self.embedding_dim)

    def check_trainable(self) -> None:
        """Raise InferenceTable when this table refuses updates (gradients)."""
        if self.inference:
            raise InferenceTable.of(self.name)


def check_transport_dtype(dtype: DType | str, transport: DType | str | None) -> None:
    """Rows travel in the table dtype, or a float32 table's in float16 or bfloat16."""
    if transport is None or DType(transport) == DType(dtype) or DType(dtype) == DType.float32:
        return
    raise ValueError(
        f"transport_dtype {DType(transport).value} needs a float32 table; "
        f"a {DType(dtype).value} table's rows travel as {DType(dtype).value}"
    )


def describe_errors(exc: ValidationError, prefix: str) -> list[str]:
    """Each error of a model's validation as ``path.to.field: message`` under ``prefix``."""
    out = []
    for err in exc.errors():
        path = ".".join([prefix, *(str(part) for part in err["loc"])])
        out.append(f"{path}: {err['msg']}")
    return out
