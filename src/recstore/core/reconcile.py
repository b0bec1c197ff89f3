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
from recstore.core.fleet import Fleet, node_args, table_fleet
from recstore.core.placement import Placement
from recstore.core.pool import POOL_NAME
from recstore.core.reshard.retry import attempt_note, retry_note
from recstore.core.routing import SlotMap
from recstore.core.spec import StorageTier, TableSpec, describe_errors
from recstore.core.status import Condition, Phase, ShardStatus, TableStatus

#: the gRPC health service a liveness probe asks: SERVING while the node process serves,
#: also while writes are stopped after a log failure ("" and the ParameterServer service
#: then say NOT_SERVING: not ready for writes, yet alive and serving reads)
LIVENESS_SERVICE = "liveness"


@dataclass(frozen=True)
class Declaration:
    """A validated table: what it is (spec) and where its shards run (placement, or the
    pool it is placed on)."""

    spec: TableSpec
    placement: Placement
    #: the EmbeddingPool whose nodes hold the table (None: a fleet of its own)
    pool: str | None = None

    @property
    def fleet(self) -> Fleet:
        """The nodes of the table's own fleet."""
        return table_fleet(self.spec, self.placement)


def parse_declaration(data: Mapping[str, Any], *, default_name: str) -> Declaration:
    """Validate a declared table (CR ``spec``: table fields plus ``placement``, or ``pool``).

    ``name`` is optional and defaults to ``default_name`` (the resource name). A table
    placed on a pool takes its shards and placement from the pool, so it may declare
    neither. Raises InvalidArgument naming every offending field.
    """
    fields = dict(data)
    pool = fields.pop("pool", None)
    placement_data = fields.pop("placement", None) or {}
    fields.setdefault("name", default_name)
    problems: list[str] = []
    if pool is not None:
        problems += pool_field_problems(pool, data)
    spec = placement = None
    try:
        spec = TableSpec.model_validate(fields)
    except ValidationError as exc:
        problems += describe_errors(exc, "spec")
    try:
        placement = Placement.model_validate(placement_data)
    except ValidationError as exc:
        problems += describe_errors(exc, "spec.placement")
    if spec is not None and placement is not None and pool is None:
        tier = StorageTier(spec.storage)
        if tier != StorageTier.host and placement.gpus == 0:
            problems.append(f"spec.storage: tier {tier.value!r} needs spec.placement.gpus >= 1")
    if problems or spec is None or placement is None:
        raise InvalidArgument("; ".join(problems))
    return Declaration(spec=spec, placement=placement, pool=pool)


def pool_field_problems(pool: Any, data: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``spec.pool`` and the fields a table on a pool may not have."""
    if not isinstance(pool, str) or not POOL_NAME.fullmatch(pool):
        return [f"spec.pool: {pool!r} is not the name of an EmbeddingPool (a DNS label)"]
    own = [f"spec.{name}" for name in ("shards", "placement") if name in data]
    if own:
        return [
            f"{' and '.join(own)}: a table on pool {pool!r} runs on the pool's nodes; "
            "declare shards and placement on the EmbeddingPool, or leave out spec.pool"
        ]
    return []


def ps_node_args(decl: Declaration, *, shard_index: int | str, **options: Any) -> list[str]:
    """Arguments of ``recstore ps-node`` for one shard of the table's own fleet
    (``recstore.core.fleet.node_args``'s options)."""
    return node_args(decl.fleet, shard_index=shard_index, **options)


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
    #: a table on a pool: where it stands (None: a table with a fleet of its own)
    pool: PoolPlacing | None = None


@dataclass(frozen=True)
class PoolPlacing:
    """A table placed on a pool: the pool, and why it does not run there (yet)."""

    name: str
    #: why it waits (the pool does not exist yet, or is not valid); None: the pool is there
    waiting: str | None = None
    #: why the pool's nodes cannot hold it (the figures); None: it fits
    capacity: str | None = None


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

    placing = observation.pool
    if deleting:
        phase = Phase.deleting
    elif problem is not None or observation.refused is not None:
        phase = Phase.failed
    elif placing is not None and placing.capacity is not None:
        phase = Phase.failed  # nothing was created: the pool's nodes cannot hold it
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
         "NodeRefused" if problem is None and observation.refused
         else "Capacity" if problem is None and placing is not None and placing.capacity
         else _ready_reason(phase),
         (observation.refused or shard_msg) if problem is None else shard_msg),
        ("Progressing", observation.rolling or phase in (Phase.pending, Phase.provisioning),
         "RollingUpdate" if observation.rolling else phase.value, shard_msg),
        ("ReshardRequired", reshard, "ShardCountChanged" if reshard else "ShardCountMatches",
         f"spec.shards is {declared_shards} but {running} shards run, and no move is running"
         if reshard else "shard count matches"),
    ]  # fmt: skip
    if placing is not None:
        wanted += [
            ("Pool", placing.waiting is None,
             "PoolFound" if placing.waiting is None else "PoolNotReady",
             placing.waiting or f"placed on pool {placing.name!r}"),
            ("Capacity", placing.capacity is None,
             "Fits" if placing.capacity is None else "Exceeded",
             placing.capacity or f"fits beside the other tables of pool {placing.name!r}"),
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
