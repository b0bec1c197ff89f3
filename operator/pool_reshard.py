"""The operator's move of a pool to a new ``shards``: every table on it, one move each.

``recstore.core.pool_reshard`` decides each step from what is stored (each table's slot
map and job in its status, the StatefulSet's replicas); this applies it: it scales the
pool's StatefulSet (grown before the tables move, shrunk once none spans the nodes
that go) and starts each table's move through the reconciler's ``ReshardControl``,
pointed at the pool's pods, where it is retried, and its failure shown, as a table's
own move is. One table's failed move (rolled back by the protocol) stops no other.
The pool's handlers call ``advance`` on a change of the pool and at each refresh;
a lock per pool keeps two calls from starting one table's move twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from recstore.core.pool import PoolResharding, PoolSpec
from recstore.core.pool_reshard import (
    PoolMoveState,
    PoolStep,
    pool_step,
    shrink_refusal,
    table_span,
)
from recstore.core.reconcile import Declaration
from recstore.operator import render
from recstore.operator.declared import Validated
from recstore.operator.kube import Kube, path
from recstore.operator.pools import Pools, placed, placement_order, table_spec
from recstore.operator.render import Owner, RenderOptions
from recstore.operator.reshard_control import ReshardControl
from recstore.operator.resharding import grow_patch

Logger = logging.Logger | logging.LoggerAdapter


class PoolMovesHost(Protocol):
    """What a pool's move uses of the reconciler that holds it."""

    kube: Kube
    pools: Pools
    reshards: ReshardControl

    @property
    def options(self) -> RenderOptions: ...

    async def validate(self, owner: Owner, spec: Mapping[str, Any]) -> Validated: ...


@dataclass
class PoolMoves:
    reconciler: PoolMovesHost
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def advance(
        self, owner: Owner, spec: PoolSpec, previous: Mapping[str, Any] | None, logger: Logger
    ) -> PoolMoveState:
        """Take the next step toward ``spec.shards`` nodes; ``previous``: the stored status."""
        async with self.locks.setdefault(owner.uid, asyncio.Lock()):
            return await self._advance(owner, spec, previous, logger)

    async def _advance(
        self, owner: Owner, spec: PoolSpec, previous: Mapping[str, Any] | None, logger: Logger
    ) -> PoolMoveState:
        rec, target = self.reconciler, spec.shards
        stored = (previous or {}).get("resharding")
        before = PoolResharding.model_validate(stored) if stored else None
        sts = await rec.pools.statefulset(owner)
        if sts is None:
            return PoolMoveState(before)
        replicas = int(sts["spec"].get("replicas", target))
        tables = {  # the tables the nodes hold: placed, and created with a stored map
            t["metadata"]["name"]: t
            for t in placement_order(await rec.pools.tables_on(owner.namespace, owner.name))
            if placed(t) and not t["metadata"].get("deletionTimestamp")
            and (t.get("status") or {}).get("slotMap")
        }  # fmt: skip
        spans = {
            name: table_span(t["status"]["slotMap"], t["status"].get("migrationJob"))
            for name, t in tables.items()
        }
        busy, failed, errors = set(), set(), {}
        for name, t in tables.items():
            resharder = rec.reshards.resharders.get(t["metadata"]["uid"])
            if resharder is None:
                continue
            if resharder.running or resharder.retrying:
                busy.add(name)
            if resharder.failed and resharder.to_shards == target and resharder.progress:
                failed.add(name)
                errors[name] = str(resharder.progress.error)
        running = max([replicas] + [span.shards for span in spans.values()])
        specs = [(n, s) for n, t in tables.items() if (s := table_spec(t, target)) is not None]
        refused = shrink_refusal(owner.name, spec, specs, running, target)
        if refused is not None:
            return PoolMoveState(before, moving=bool(busy), refused=refused)
        step = pool_step(
            target=target, replicas=replicas, tables=spans, busy=busy, failed=failed,
            previous=before,
        )  # fmt: skip
        await self._scale(owner, spec, replicas, step, logger)
        for name in step.move:
            await self._move(owner, tables[name], target, spans[name].shards, logger)
        moving = bool(busy or step.move or step.scale_to is not None)
        return PoolMoveState(step.progress, moving=moving, errors=errors)

    async def _scale(
        self, owner: Owner, spec: PoolSpec, replicas: int, step: PoolStep, logger: Logger
    ) -> None:
        if step.scale_to is None:
            return
        url = path("StatefulSet", owner.namespace, render.fleet_name(owner))
        count = step.scale_to
        if count > replicas:
            fleet = replace(spec.fleet, shards=count)
            template = render.render_statefulset(owner, fleet, self.reconciler.options)
            patch = grow_patch(replicas, count, template["spec"]["template"])
        else:
            patch = {"spec": {"replicas": count}}
        logger.info(f"pool {owner.name!r}: {replicas} -> {count} nodes")
        await self.reconciler.kube.patch(url, patch)

    async def _move(
        self, pool: Owner, table: dict[str, Any], target: int, spans: int, logger: Logger
    ) -> None:
        meta = table["metadata"]
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        checked = await self.reconciler.validate(owner, table.get("spec") or {})
        decl = checked.declaration
        if decl is None or checked.held:
            return  # invalid or not held by the nodes now: nothing of it to move
        moving = Declaration(decl.spec.model_copy(update={"shards": target}), decl.placement,
                             pool=decl.pool)  # fmt: skip
        await self.reconciler.reshards.start(owner, moving, spans, logger, fleet=pool)
