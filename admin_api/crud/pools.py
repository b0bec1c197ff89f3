"""Pool catalogue operations behind ``routes/pools.py``: create, read, patch, delete, status,
and where a table placed on a pool takes its shards from."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from recstore.admin import views
from recstore.admin.crud import audit
from recstore.admin.crud.paging import page
from recstore.admin.crud.writes import writes
from recstore.admin.errors import NotFound, VersionConflict
from recstore.admin.models import PoolRecord, TableRecord
from recstore.admin.spec_patch import apply_pool_patch
from recstore.core import SlotMap, TableSpec
from recstore.core.errors import InvalidArgument, TableExists
from recstore.core.pool import PoolSpec, PoolStatus, checkpoint_problem, table_problem_on
from recstore.core.reconcile import pool_field_problems
from recstore.core.spec import StorageTier


class PoolExists(TableExists):
    """A pool of that name exists (HTTP 409)."""


class PoolHoldsTables(VersionConflict):
    """A pool that tables are placed on cannot go (HTTP 409)."""


def get_pool(session: Session, *, name: str) -> PoolRecord:
    pool = find_pool(session, name=name)
    if pool is None:
        raise NotFound(f"pool {name!r} not found")
    return pool


def find_pool(session: Session, *, name: str) -> PoolRecord | None:
    return session.scalar(select(PoolRecord).where(PoolRecord.name == name))


def list_pools(session: Session, *, limit: int, offset: int) -> tuple[list[PoolRecord], int]:
    return page(session, select(PoolRecord).order_by(PoolRecord.name), limit=limit, offset=offset)


def tables_on(session: Session, *, name: str) -> list[TableRecord]:
    """The catalogue's tables that name the pool, by name."""
    query = select(TableRecord).where(TableRecord.pool == name).order_by(TableRecord.name)
    return list(session.scalars(query))


def create_pool(session: Session, *, name: str, spec: PoolSpec, actor: str) -> PoolRecord:
    """Record the pool; the tables that waited for it take its shards and checkpoints."""
    exists = PoolExists(f"pool {name!r} already exists")
    if find_pool(session, name=name) is not None:
        raise exists
    pool = PoolRecord(
        name=name, spec=spec.model_dump(mode="json"), generation=1, phase="Pending",
        created_by=actor,
    )  # fmt: skip
    with writes(session, on_duplicate=exists):
        session.add(pool)
    for table in tables_on(session, name=name):
        held = held_spec(name, spec, views.spec_of(table), declared=None)
        with writes(session):
            table.spec = held.model_dump(mode="json")
            table.slot_map = SlotMap.initial(held.shards).to_dict()
    audit.record(session, actor, "pool.create", resource=name, after=views.pool_snapshot(pool))
    return pool


def held_spec(
    pool: str, pool_spec: PoolSpec, spec: TableSpec, *, declared: set[str] | None
) -> TableSpec:
    """The table the pool's nodes hold: the pool's shard count and checkpoints. InvalidArgument
    when the table cannot run there (a GPU tier on a pool without GPUs, checkpoints of its own);
    ``declared``: the fields the table was declared with (None: it was accepted before)."""
    problem = table_problem_on(pool, pool_spec, StorageTier(spec.storage))
    if declared is None or "checkpoint" in declared:
        problem = problem or checkpoint_problem(pool, pool_spec, spec.checkpoint)
    if problem is not None:
        raise InvalidArgument(problem)
    return spec.model_copy(update={"shards": pool_spec.shards, "checkpoint": pool_spec.checkpoint})


def placed_spec(session: Session, *, pool: str, spec: TableSpec, declared: set[str]) -> TableSpec:
    """The spec a table declared on ``pool`` is recorded with: the pool's shards and
    checkpoints when the pool exists (else as declared, until it does). InvalidArgument for
    fields a table on a pool may not declare, or a table the pool cannot hold."""
    problems = pool_field_problems(pool, {name: True for name in declared})
    if problems:
        raise InvalidArgument("; ".join(problems))
    record = find_pool(session, name=pool)
    if record is None:
        return spec
    return held_spec(pool, views.pool_spec_of(record), spec, declared=declared)


def check_version(pool: PoolRecord, expected: int | None) -> None:
    if expected is not None and expected != pool.resource_version:
        raise VersionConflict(
            f"pool {pool.name!r} is at resourceVersion {pool.resource_version}, "
            f"the request was made against {expected}; read it again"
        )


def patch_pool(
    session: Session,
    *,
    pool: PoolRecord,
    changes: dict[str, Any],
    expected_version: int | None,
    actor: str,
) -> tuple[PoolRecord, PoolSpec | None]:
    """Apply a partial spec; returns the pool and the previous spec (None: nothing changed)."""
    check_version(pool, expected_version)
    previous = views.pool_spec_of(pool)
    updated = apply_pool_patch(previous, changes)
    if updated == previous:
        return pool, None
    before = views.pool_snapshot(pool)
    with writes(session):
        pool.spec = updated.model_dump(mode="json")
        pool.generation += 1
    if updated.shards != previous.shards:  # its tables move with it
        for table in tables_on(session, name=pool.name):
            with writes(session):
                table.spec = {**table.spec, "shards": updated.shards}
    audit.record(session, actor, "pool.update", resource=pool.name, before=before,
                 after=views.pool_snapshot(pool))  # fmt: skip
    return pool, previous


def delete_pool(
    session: Session, *, pool: PoolRecord, expected_version: int | None, actor: str
) -> None:
    """Forget the pool; refused (409, naming them) while tables are placed on it."""
    check_version(pool, expected_version)
    holding = [t.name for t in tables_on(session, name=pool.name)]
    if holding:
        raise PoolHoldsTables(
            f"pool {pool.name!r} still holds tables {', '.join(holding)}: delete them first"
        )
    before = views.pool_snapshot(pool)
    with writes(session):
        session.delete(pool)
    audit.record(session, actor, "pool.delete", resource=pool.name, before=before)


def set_pool_status(
    session: Session, *, pool: PoolRecord, status: PoolStatus, actor: str
) -> PoolRecord:
    before = views.pool_snapshot(pool)
    with writes(session):
        pool.status = status.to_wire()
        pool.phase = pool.status["phase"]
    after = views.pool_snapshot(pool)
    if after != before:
        audit.record(session, actor, "pool.status", resource=pool.name, before=before, after=after)
    return pool
