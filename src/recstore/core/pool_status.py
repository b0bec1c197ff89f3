"""A pool's status from what runs for it and the tables placed on it.

Both provisioners report a pool the same way: its nodes' phase and conditions as a
table's (``compute_status``), the tables it holds with what each reserves per node,
the memory reserved against the pool's request, whether every table fits, how a
change of its shards goes, and while a deletion waits, the tables it waits for. The
operator reads its tables from their resources, the local provisioner from its own
records; both hand this the same facts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from recstore.core.pool import PoolMemory, PoolSpec, PoolStatus, PoolTable
from recstore.core.pool_capacity import NODE_BYTES, Admission, budget
from recstore.core.pool_reshard import PoolMoveState
from recstore.core.reconcile import Observation, compute_status
from recstore.core.status import Condition, Phase, TableStatus


@dataclass(frozen=True)
class TableOnPool:
    """A table that names the pool, as its own status says."""

    name: str
    phase: str | None = None
    #: the shards of its slot map (None before it has one)
    shards: int | None = None


def pool_status(
    *,
    problem: str | None,
    spec: PoolSpec | None,
    observation: Observation,
    admission: Admission | None,
    tables: Sequence[TableOnPool],
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
            need = admission.placed.get(table.name)
            listed.append(PoolTable(
                name=table.name, phase=table.phase, shards=table.shards,
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
