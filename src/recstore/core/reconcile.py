"""The reconcile core: declared table -> desired shards, observed shards -> status.

Two provisioners drive tables: the Kubernetes operator and the local one of
``recstore up``. Both need the same answers — is this declaration valid, which
shards should run with which arguments, and what phase and conditions follow
from what is running — so the answers live here as pure functions: no
Kubernetes client, no kopf, no I/O, the clock passed in. Each provisioner only
observes its world, calls these, and applies the result.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from recstore.core.checkpoint_status import TableCheckpoint, clip, rfc3339
from recstore.core.errors import InvalidArgument
from recstore.core.placement import Placement
from recstore.core.reshard.retry import attempt_note, retry_note
from recstore.core.routing import SlotMap
from recstore.core.spec import Durability, StorageTier, TableSpec
from recstore.core.status import Condition, Phase, ShardStatus, TableStatus
from recstore.core.tls import ServerTls

GRPC_PORT = 50051
#: a PS pod listens on all its addresses (loopback is the node's own default)
POD_LISTEN_HOST = "0.0.0.0"
METRICS_PORT = 9100
#: the gRPC health service a liveness probe asks: SERVING while the node process serves,
#: also while writes are stopped after a log failure ("" and the ParameterServer service
#: then say NOT_SERVING: not ready for writes, yet alive and serving reads)
LIVENESS_SERVICE = "liveness"
DATA_DIR = "/data"


@dataclass(frozen=True)
class Declaration:
    """A validated table: what it is (spec) and where its shards run (placement)."""

    spec: TableSpec
    placement: Placement


def parse_declaration(data: Mapping[str, Any], *, default_name: str) -> Declaration:
    """Validate a declared table (CR ``spec``: table fields plus ``placement``).

    ``name`` is optional and defaults to ``default_name`` (the resource name).
    Raises InvalidArgument naming every offending field.
    """
    fields = dict(data)
    placement_data = fields.pop("placement", None) or {}
    fields.setdefault("name", default_name)
    problems: list[str] = []
    spec = placement = None
    try:
        spec = TableSpec.model_validate(fields)
    except ValidationError as exc:
        problems += _describe(exc, "spec")
    try:
        placement = Placement.model_validate(placement_data)
    except ValidationError as exc:
        problems += _describe(exc, "spec.placement")
    if spec is not None and placement is not None:
        tier = StorageTier(spec.storage)
        if tier != StorageTier.host and placement.gpus == 0:
            problems.append(f"spec.storage: tier {tier.value!r} needs spec.placement.gpus >= 1")
    if problems or spec is None or placement is None:
        raise InvalidArgument("; ".join(problems))
    return Declaration(spec=spec, placement=placement)


def _describe(exc: ValidationError, prefix: str) -> list[str]:
    out = []
    for err in exc.errors():
        path = ".".join([prefix, *(str(part) for part in err["loc"])])
        out.append(f"{path}: {err['msg']}")
    return out


def takes_read_only_token(spec: TableSpec) -> bool:
    """Whether a table's nodes accept read-only tokens: those serving an inference table
    (its readers never write; a training table's trainers all do)."""
    return spec.inference


def ps_node_args(
    decl: Declaration,
    *,
    shard_index: int | str,
    port: int = GRPC_PORT,
    metrics_port: int = METRICS_PORT,
    data_dir: str = DATA_DIR,
    auth_token_file: str | None = None,
    read_only_token_file: str | None = None,
    host: str = POD_LISTEN_HOST,
    tls: ServerTls | None = None,
) -> list[str]:
    """Arguments of ``recstore ps-node`` for one shard.

    ``read_only_token_file`` is passed to the nodes of a table that takes read-only
    tokens (``takes_read_only_token``); it needs ``auth_token_file``.

    ``host`` is the address the node listens on: every address of a pod by
    default (its Service reaches it there); the node itself defaults to loopback.

    ``shard_index`` may be a string such as ``$(RECSTORE_SHARD_INDEX)`` where
    the runtime substitutes it (Kubernetes expands ``$(VAR)`` in args).
    """
    args = [
        "ps-node",
        "--port", str(port),
        "--metrics-port", str(metrics_port),
        "--data-dir", data_dir,
        "--shard-index", str(shard_index),
        "--num-shards", str(decl.spec.shards),
        "--device", "cpu" if StorageTier(decl.spec.storage) == StorageTier.host else "cuda",
        "--durability", Durability(decl.spec.checkpoint.durability).value,
        "--checkpoint-interval", str(decl.spec.checkpoint.interval_seconds),
        "--keep-checkpoints", str(decl.spec.checkpoint.keep),
        "--host", host,
    ]  # fmt: skip
    if read_only_token_file and not auth_token_file:
        raise ValueError("a read-only token file needs an auth token file (else anyone writes)")
    if auth_token_file:
        args += ["--auth-token-file", auth_token_file]
    if read_only_token_file and takes_read_only_token(decl.spec):
        args += ["--read-only-token-file", read_only_token_file]
    if tls is not None:
        args += tls.args()
    return args


@dataclass(frozen=True)
class ShardPlan:
    index: int
    endpoint: str  # host:port clients dial
    args: tuple[str, ...]


def plan_shards(
    decl: Declaration, endpoint_of: Callable[[int], str], **arg_options: Any
) -> list[ShardPlan]:
    """One plan per shard, in shard order (the order of discovery's ``endpoints``)."""
    return [
        ShardPlan(
            index=i,
            endpoint=endpoint_of(i),
            args=tuple(ps_node_args(decl, shard_index=i, **arg_options)),
        )
        for i in range(decl.spec.shards)
    ]


@dataclass(frozen=True)
class ShardState:
    index: int
    endpoint: str
    ready: bool


@dataclass(frozen=True)
class Observation:
    """What a provisioner sees running for one table."""

    #: shard count of the running workload; None when nothing runs yet.
    running_shards: int | None = None
    #: a rollout to a new shard template is still under way.
    rolling: bool = False
    shards: tuple[ShardState, ...] = ()
    #: the newest checkpoint every shard wrote, when the provisioner took one since the
    #: status was last written (else the previous status's stands)
    last_checkpoint: TableCheckpoint | None = None
    #: the on-demand checkpoint the provisioner is taking or took last (else the previous
    #: status's stands)
    checkpoint_request: TableCheckpoint | None = None
    #: why a node refused to host the table (e.g. a GPU table on a node without a GPU):
    #: retrying the same declaration cannot help, so the table is Failed with this reason
    refused: str | None = None
    #: an online resharding running (or the last one's failure)
    resharding: Resharding | None = None
    #: a shard count declared while a move runs, started when that move ends (operator)
    queued_shards: int | None = None


@dataclass(frozen=True)
class Resharding:
    """Progress of a table's online move to a new shard count (recstore.core.reshard.plan)."""

    from_shards: int
    to_shards: int
    slots_moved: int
    slots_total: int
    bytes_moved: int
    epoch: int
    running: bool = True
    error: str | None = None  # why the last attempt stopped (the source stayed authoritative)
    attempt: int = 1  # tries of this change so far (a failed one is retried)
    retry_in_s: float | None = None  # when the next try starts (None: none is planned)

    def describe(self) -> str:
        done = f"{self.slots_moved}/{self.slots_total} slots moved, {self.bytes_moved} bytes"
        where = f"{self.from_shards} -> {self.to_shards} shards, slot-map epoch {self.epoch}"
        tries = attempt_note(self.attempt)
        if self.error:
            then = retry_note(self.attempt, self.retry_in_s)
            return f"resharding {where} stopped at {done}{tries}: {self.error}{then}"
        return f"resharding {where}: {done}{tries}"


def compute_status(
    *,
    problem: str | None,
    declared_shards: int | None,
    observation: Observation,
    generation: int,
    previous: TableStatus | None,
    now: dt.datetime,
    deleting: bool = False,
) -> TableStatus:
    """The table's status.

    ``problem`` is the validation message of an invalid declaration (None when
    valid); ``previous`` the last status written, which keeps condition
    transition times stable, tells Degraded (was ready) from Provisioning and keeps
    the checkpoints the observation does not report anew.
    """
    shards = observation.shards
    ready = sum(s.ready for s in shards)
    running = observation.running_shards
    moving = observation.resharding
    reshard = (
        problem is None and running is not None and running != declared_shards
        and not (moving and moving.running)
    )  # fmt: skip
    all_ready = running is not None and ready == running == len(shards) and running > 0

    if deleting:
        phase = Phase.deleting
    elif problem is not None or observation.refused is not None:
        phase = Phase.failed
    elif running is None:
        phase = Phase.pending
    elif not observation.rolling and moving is not None and moving.running:
        # a growth's new shards start owning no slot: they are not a degradation
        phase = Phase.resharding if slot_owners_ready(observation) else _not_ready(previous)
    elif all_ready and not observation.rolling:
        phase = Phase.ready
    elif not observation.rolling:
        phase = _not_ready(previous)
    else:
        phase = Phase.provisioning

    shard_msg = f"{ready}/{running or 0} shards ready"
    wanted = [
        ("SpecValid", problem is None, "Accepted" if problem is None else "InvalidSpec",
         "the declaration is valid" if problem is None else problem),
        ("Ready", phase in (Phase.ready, Phase.resharding),
         "NodeRefused" if problem is None and observation.refused else _ready_reason(phase),
         (observation.refused or shard_msg) if problem is None else shard_msg),
        ("Progressing", observation.rolling or phase in (Phase.pending, Phase.provisioning),
         "RollingUpdate" if observation.rolling else phase.value, shard_msg),
        ("ReshardRequired", reshard, "ShardCountChanged" if reshard else "ShardCountMatches",
         f"spec.shards is {declared_shards} but {running} shards run, and no move is running"
         if reshard else "shard count matches"),
    ]  # fmt: skip
    if moving is not None:
        wanted.append(
            ("Resharding", moving.running,
             "MovingSlots" if moving.running else ("MoveFailed" if moving.error else "MoveDone"),
             moving.describe())
        )  # fmt: skip
    old = {c.type: c for c in previous.conditions} if previous is not None else {}
    queued = observation.queued_shards
    if queued is not None or "ReshardQueued" in old:
        running_to = moving.to_shards if moving is not None else declared_shards
        wanted.append(
            ("ReshardQueued", queued is not None,
             "ShardCountQueued" if queued is not None else "NothingQueued",
             f"spec.shards is {queued} while the move to {running_to} shards runs; "
             "it starts when that move ends" if queued is not None
             else "no shard change waits for a move")
        )  # fmt: skip
    conditions = [
        _condition(kind, ok, reason, message, generation, now, old.get(kind))
        for kind, ok, reason, message in wanted
    ]
    kept = previous or TableStatus(phase=phase)  # what the observation does not say anew
    return TableStatus(
        phase=phase,
        conditions=conditions,
        observed_generation=generation,
        ready_shards=ready,
        shards=[ShardStatus(index=s.index, endpoint=s.endpoint, ready=s.ready) for s in shards],
        slot_map_epoch=kept.slot_map_epoch or SlotMap.initial(1).epoch,
        last_checkpoint=observation.last_checkpoint or kept.last_checkpoint,
        checkpoint_request=observation.checkpoint_request or kept.checkpoint_request,
    )


def slot_owners_ready(observation: Observation) -> bool:
    """During a move: every shard that may own slots serves. A growth's new shards own
    none until its first batch commits (they are started first); a shrink's highest
    shards own theirs until the move ends."""
    moving = observation.resharding
    assert moving is not None
    owners = moving.from_shards
    if moving.slots_moved > 0:
        owners = max(moving.from_shards, moving.to_shards)
    states = [s for s in observation.shards if s.index < owners]
    return len(states) == owners and all(s.ready for s in states)


def _not_ready(previous: TableStatus | None) -> Phase:
    """A table that served and lost a shard is Degraded; one that never served, starting."""
    served = previous is not None and previous.phase in (
        Phase.ready, Phase.degraded, Phase.resharding
    )  # fmt: skip
    return Phase.degraded if served else Phase.provisioning


def _ready_reason(phase: Phase) -> str:
    return {
        Phase.ready: "AllShardsReady",
        Phase.resharding: "AllShardsReady",
        Phase.failed: "InvalidSpec",
        Phase.deleting: "Deleting",
        Phase.pending: "NoShardsYet",
        Phase.degraded: "ShardsNotReady",
        Phase.provisioning: "ShardsStarting",
    }[phase]


def _condition(
    kind: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    now: dt.datetime,
    old: Condition | None,
) -> Condition:
    status: Literal["True", "False"] = "True" if ok else "False"
    unchanged = old is not None and old.status == status and old.last_transition_time
    stamp = old.last_transition_time if unchanged and old else rfc3339(now)
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=clip(message),  # e.g. every problem of a bad declaration: kept within bounds
        last_transition_time=stamp,
        observed_generation=generation,
    )
