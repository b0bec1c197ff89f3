"""kopf handlers for EmbeddingPool: its children, its status, and a deletion it refuses.

Create, update and resume render the pool's StatefulSet, Service and PDB; a timer
writes the status (the nodes, the tables placed on it and the memory they reserve
per node, ``pool_status``); deleting a pool that still holds tables is refused by
its finalizer, with a ``Deletable`` condition naming them, until they are gone.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any, Literal

import kopf

from recstore.core.pool import PoolMemory, PoolSpec, PoolStatus, PoolTable
from recstore.core.pool_capacity import NODE_BYTES, Admission, budget
from recstore.core.reconcile import Observation, compute_status
from recstore.core.resource import GROUP, POOL_KIND, POOL_PLURAL, VERSION
from recstore.core.routing import SlotMap
from recstore.core.status import Condition, Phase, TableStatus
from recstore.operator import render
from recstore.operator.config import OperatorConfig
from recstore.operator.kube import path
from recstore.operator.pool_reshard import PoolMoveState
from recstore.operator.pools import pool_owner, pool_problem
from recstore.operator.reconciler import Reconciler
from recstore.operator.status import observe, status_changed

POOL = (GROUP, VERSION, POOL_PLURAL)


def pool_status(
    *,
    problem: str | None,
    spec: PoolSpec | None,
    observation: Observation,
    admission: Admission | None,
    tables: list[dict[str, Any]],
    generation: int,
    previous: Mapping[str, Any] | None,
    now: dt.datetime,
    holding: list[str] | None = None,
    moves: PoolMoveState | None = None,
) -> PoolStatus:
    """The pool's status: its nodes as a table's (phase, Ready), the tables it holds and
    their memory; ``holding``: the tables a requested deletion waits for; ``moves``: a
    change of its shards (phase Resharding while it runs, condition Resharding)."""
    before = PoolStatus.model_validate(previous) if previous and previous.get("phase") else None
    as_table = TableStatus(phase=before.phase, conditions=before.conditions) if before else None
    moving = moves is not None and moves.moving
    declared = spec.shards if spec else None
    nodes = compute_status(
        problem=problem, declared_shards=observation.running_shards if moving else declared,
        observation=observation, generation=generation, previous=as_table, now=now,
    )  # fmt: skip
    conditions = list(nodes.conditions)
    phase, kept = nodes.phase, before.resharding if before is not None else None
    if moving and phase in (Phase.ready, Phase.degraded, Phase.provisioning):
        phase = Phase.resharding
    if moves is not None and (moves.progress is not None or moves.refused is not None):
        conditions.append(_condition(
            "Resharding", moving and moves.refused is None, *_resharding(moves), generation,
            now, before,
        ))  # fmt: skip
    listed, memory = [], None
    if spec is not None and admission is not None:
        for table in tables:
            name = table["metadata"]["name"]
            need = admission.placed.get(name)
            stored = (table.get("status") or {}).get("slotMap")
            listed.append(PoolTable(
                name=name, phase=(table.get("status") or {}).get("phase"),
                shards=SlotMap.from_dict(stored).num_shards if stored else None,
                memory_bytes=need.host if need else 0, gpu_memory_bytes=need.gpu if need else 0,
                placed=need is not None,
            ))  # fmt: skip
        limits = budget(spec)
        memory = PoolMemory(
            request_bytes=limits.request, node_bytes=NODE_BYTES,
            reserved_bytes=admission.reserved.host, gpu_request_bytes=limits.gpu,
            gpu_reserved_bytes=admission.reserved.gpu,
        )  # fmt: skip
        refused = sorted(admission.refused)
        conditions.append(_condition(
            "Capacity", not refused, "Fits" if not refused else "TablesRefused",
            f"tables that do not fit: {', '.join(refused)}" if refused
            else f"{len(admission.placed)} tables fit", generation, now, before,
        ))  # fmt: skip
    if holding is not None:
        conditions.append(_condition(
            "Deletable", not holding, "HoldsTables" if holding else "Empty",
            f"the pool still holds tables {', '.join(holding)}: delete them first" if holding
            else "no table is placed on the pool", generation, now, before,
        ))  # fmt: skip
    return PoolStatus(
        phase=phase, conditions=conditions, observed_generation=generation,
        ready_shards=nodes.ready_shards, shards=nodes.shards, tables=listed, memory=memory,
        resharding=moves.progress if moves is not None else kept,
    )  # fmt: skip


def _resharding(moves: PoolMoveState) -> tuple[str, str]:
    """The Resharding condition's reason and message."""
    if moves.refused is not None:
        return "CapacityExceeded", moves.refused
    p = moves.progress
    assert p is not None
    where = f"resharding {p.from_shards} -> {p.to_shards} shards: "
    where += f"{p.tables_moved}/{p.tables_total} tables moved"
    failed = "; ".join(f"{name}: {moves.errors.get(name, 'failed')}" for name in p.failed)
    if failed:
        where += f"; failed (rolled back, retried as a table's move is) {failed}"
    if moves.moving:
        return "MovingTables", where
    return ("MoveFailed" if p.failed else "MoveDone"), where


def _condition(
    kind: str, ok: bool, reason: str, message: str, generation: int, now: dt.datetime,
    before: PoolStatus | None,
) -> Condition:  # fmt: skip
    status: Literal["True", "False"] = "True" if ok else "False"
    old = next((c for c in before.conditions if c.type == kind), None) if before else None
    stamp = old.last_transition_time if old is not None and old.status == status else None
    return Condition(
        type=kind, status=status, reason=reason, message=message[:1000],
        last_transition_time=stamp or now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        observed_generation=generation,
    )  # fmt: skip


def register(
    registry: kopf.OperatorRegistry, config: OperatorConfig, reconciler: Callable[[], Reconciler]
) -> None:
    """The pool handlers; ``reconciler`` gives the operator's (once logged in)."""

    async def current(
        body: kopf.Body, holding: list[str] | None, moves: PoolMoveState | None = None
    ) -> dict[str, Any]:
        rec, owner = reconciler(), pool_owner(body)
        spec, problem = valid(body)
        sts = await rec.pools.statefulset(owner)
        pods = []
        if sts is not None:
            pods = await rec.kube.list(
                path("Pod", owner.namespace), labels=render.selector_labels(owner)
            )
        endpoint = lambda i: render.shard_endpoint(owner, i, rec.options)  # noqa: E731
        observation = observe(sts, pods, endpoint)
        admission, tables = None, list[dict[str, Any]]()
        if spec is not None:
            shards = observation.running_shards or spec.shards
            admission, tables = await rec.pools.admission(owner.namespace, owner.name, spec, shards)
        status = pool_status(
            problem=problem, spec=spec, observation=observation, admission=admission,
            tables=tables, generation=int(body["metadata"].get("generation") or 1),
            previous=body.get("status"), now=dt.datetime.now(dt.timezone.utc), holding=holding,
            moves=moves,
        ).to_wire()  # fmt: skip
        return status

    async def write_status(
        body: kopf.Body, patch: kopf.Patch, moves: PoolMoveState | None = None
    ) -> None:
        status = await current(body, None, moves)
        if status_changed(body.get("status"), status):
            patch.status.update(status)

    def valid(body: kopf.Body) -> tuple[PoolSpec | None, str | None]:
        spec, problem = pool_problem(body["metadata"]["name"], body.get("spec") or {})
        if spec is not None and problem is None:
            problem = reconciler().config.image_problem(spec.placement.image)
        return (None, problem) if problem else (spec, None)

    async def apply(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
        rec, owner = reconciler(), pool_owner(body)
        (spec, problem), moves = valid(body), None
        if spec is None:
            logger.error(f"invalid EmbeddingPool, nothing changed: {problem}")
        else:
            await rec.pools.apply(owner, spec)
            moves = await rec.pool_moves.advance(owner, spec, body.get("status"), logger)
        await write_status(body, patch, moves)

    backoff = config.retry_delay
    kopf.on.create(*POOL, id="pool-create", backoff=backoff, registry=registry)(apply)
    kopf.on.update(*POOL, id="pool-update", backoff=backoff, field="spec", registry=registry)(apply)
    kopf.on.resume(*POOL, id="pool-resume", backoff=backoff, registry=registry)(apply)

    @kopf.timer(*POOL, interval=config.status_interval, idle=0, registry=registry)
    async def refresh(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
        """The status, after the next step of a change of shards (a move that ended)."""
        if body["metadata"].get("deletionTimestamp"):
            return
        rec, owner = reconciler(), pool_owner(body)
        (spec, _problem), moves = valid(body), None
        if spec is not None:
            moves = await rec.pool_moves.advance(owner, spec, body.get("status"), logger)
        await write_status(body, patch, moves)

    @kopf.on.delete(*POOL, id="pool-finalize", backoff=backoff, registry=registry)
    async def finalize(body: kopf.Body, **_: Any) -> None:
        rec, owner = reconciler(), pool_owner(body)
        holding = sorted(
            t["metadata"]["name"] for t in await rec.pools.tables_on(owner.namespace, owner.name)
        )
        if holding:
            url = path(POOL_KIND, owner.namespace, owner.name, "status")
            await rec.kube.patch(url, {"status": await current(body, holding)})
            raise kopf.TemporaryError(
                f"pool {owner.name!r} still holds tables {', '.join(holding)}", delay=backoff
            )
        await rec.pools.remove_children(owner)
