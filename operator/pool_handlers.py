"""kopf handlers for EmbeddingPool: its children, its status, and a deletion it refuses.

Create, update and resume render the pool's StatefulSet, Service and PDB; a timer
writes the status (the nodes, the tables placed on it and the memory they reserve
per node, ``pool_status``); deleting a pool that still holds tables is refused by
its finalizer, with a ``Deletable`` condition naming them, until they are gone.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import kopf

from recstore.core.pool import PoolSpec, PoolStatus
from recstore.core.pool_reshard import PoolMoveState
from recstore.core.pool_status import TableOnPool
from recstore.core.pool_status import pool_status as core_pool_status
from recstore.core.resource import GROUP, POOL_KIND, POOL_PLURAL, VERSION
from recstore.core.routing import SlotMap
from recstore.operator import render
from recstore.operator.config import OperatorConfig
from recstore.operator.kube import path
from recstore.operator.pools import pool_owner, pool_problem
from recstore.operator.reconciler import Reconciler
from recstore.operator.status import observe, status_changed

POOL = (GROUP, VERSION, POOL_PLURAL)


def pool_status(*, tables: list[dict[str, Any]], **facts: Any) -> PoolStatus:
    """``recstore.core.pool_status.pool_status`` over the pool's EmbeddingTable resources."""
    on_pool = []
    for table in tables:
        status = table.get("status") or {}
        stored = status.get("slotMap")
        on_pool.append(TableOnPool(
            name=table["metadata"]["name"], phase=status.get("phase"),
            shards=SlotMap.from_dict(stored).num_shards if stored else None,
        ))  # fmt: skip
    return core_pool_status(tables=on_pool, **facts)


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
