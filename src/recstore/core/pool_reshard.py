"""Resharding a pool: what its nodes and its tables do next, decided from what is stored.

A change of a pool's ``shards`` moves each of its tables with the online protocol
(``recstore.core.reshard``), one move per table, while the pool's node count follows:
grown before any table moves (a new node starts owning no slot), shrunk only once no
table spans the nodes that go (a table whose move failed keeps the nodes it uses). A
shrink whose tables would not fit the fewer nodes is refused before anything moves.
Pure functions of the stored slot maps and jobs, so every tick of a provisioner, and a
restarted one, takes the same step.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recstore.core.pool import PoolResharding, PoolSpec
from recstore.core.pool_capacity import admit
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec


@dataclass(frozen=True)
class TableSpan:
    """Where one table of the pool stands."""

    #: the nodes it uses: its slot map's, or an unfinished move's widest count
    shards: int
    #: no move of it is unfinished: its map spans exactly ``shards`` nodes
    settled: bool


def table_span(slot_map: Mapping[str, Any], job: Mapping[str, Any] | None) -> TableSpan:
    """A table's span from its stored ``slotMap`` and ``migrationJob`` (their wire forms)."""
    shards = SlotMap.from_dict(slot_map).num_shards
    if job is None or job.get("phase") == "done":
        return TableSpan(shards, settled=True)
    return TableSpan(max(shards, int(job["from_shards"]), int(job["to_shards"])), settled=False)


@dataclass(frozen=True)
class PoolStep:
    """What to do now for a pool whose declared shards are ``progress.to_shards``."""

    #: the node count to set now (grow before the moves, shrink after); None: keep it
    scale_to: int | None
    #: tables to start moving to the declared count (none of them has a move running)
    move: tuple[str, ...]
    #: how far the tables are (None: no change of shards was ever asked)
    progress: PoolResharding | None


def pool_step(
    *,
    target: int,
    replicas: int,
    tables: Mapping[str, TableSpan],
    busy: Collection[str] = (),
    failed: Collection[str] = (),
    previous: PoolResharding | None = None,
) -> PoolStep:
    """The next step toward ``target`` nodes for a pool running ``replicas``.

    ``busy``: tables whose move runs or waits for its retry; ``failed``: tables whose last
    try at this target failed (busy too while a retry waits; not moved again once the
    retries are spent: a new change of shards or a restart tries again). ``previous``: the
    progress stored last, which keeps the count the change started from (without it, the
    most nodes a table spans).
    """
    moved = sorted(name for name, span in tables.items() if span.settled and span.shards == target)
    behind = sorted(set(tables) - set(moved))
    ongoing = previous is not None and previous.to_shards == target
    if not ongoing and not behind and replicas == target:
        return PoolStep(None, (), previous)  # nothing asked since the last change ended
    # a change's start: the nodes its tables spanned (a pool grown already, its status
    # written by another step at the same time, still started where its tables were)
    widest = max((span.shards for span in tables.values()), default=replicas)
    start = previous.from_shards if ongoing and previous is not None else widest
    progress = PoolResharding(
        from_shards=start, to_shards=target, tables_moved=len(moved), tables_total=len(tables),
        failed=sorted(set(failed) & set(behind)),
    )  # fmt: skip
    if replicas < target:
        scale_to: int | None = target  # new nodes first: they own no slot until a move gives one
    else:
        floor = max([target] + [tables[name].shards for name in behind])
        scale_to = floor if floor < replicas else None  # never below a table's nodes
    move = tuple(n for n in behind if n not in busy and n not in failed)
    return PoolStep(scale_to, move, progress)


def shrink_refusal(
    pool_name: str,
    spec: PoolSpec,
    tables: Sequence[tuple[str, TableSpec]],
    running: int,
    target: int,
) -> str | None:
    """Why the pool's ``tables`` (in placement order) cannot move from ``running`` to
    ``target`` nodes: each one's share would not fit the fewer nodes (the figures)."""
    if target >= running:
        return None
    admission = admit(pool_name, spec, tables, target)
    if not admission.refused:
        return None
    return (
        f"shrinking pool {pool_name!r} from {running} to {target} nodes is refused and nothing "
        f"moved: {'; '.join(admission.refused.values())}"
    )


@dataclass(frozen=True)
class PoolMoveState:
    """Where a change of the pool's shards stands, for its status."""

    progress: PoolResharding | None
    #: nodes, tables or retries are still moving
    moving: bool = False
    #: why a shrink was refused (the capacity figures); nothing moved
    refused: str | None = None
    #: the failed tables' errors, by table
    errors: dict[str, str] = field(default_factory=dict)
