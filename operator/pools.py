"""The operator's pools: a pool's children, the tables placed on it, and their capacity.

An EmbeddingPool renders the same StatefulSet, headless Service and PDB as a table's
own fleet (``recstore.operator.render`` from the pool's ``Fleet``). Tables name it in
``spec.pool``; which of them the nodes hold is decided in one order for every reader
(``placement_order``): the tables already placed first, then by creation, each placed
when it fits beside those before it (``recstore.core.pool_capacity.admit``). So a table's
own refusal, the pool's status and a later table's check agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from recstore.core.errors import InvalidArgument
from recstore.core.pool import PoolSpec, checkpoint_problem, parse_pool, table_problem_on
from recstore.core.pool_capacity import Admission, admit
from recstore.core.reconcile import Declaration, PoolPlacing, parse_declaration
from recstore.core.resource import POOL_KIND
from recstore.core.routing import SlotMap
from recstore.core.spec import StorageTier, TableSpec
from recstore.operator import render
from recstore.operator.declared import Validated
from recstore.operator.kube import Kube, path
from recstore.operator.render import Owner, RenderOptions


def pool_owner(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], kind=POOL_KIND)


def pool_problem(name: str, spec: Mapping[str, Any]) -> tuple[PoolSpec | None, str | None]:
    """The pool's spec, or why nothing may run for it."""
    problem = render.name_problem(name, longest=render.MAX_POOL_NAME)
    try:
        parsed = parse_pool(spec)
    except InvalidArgument as exc:
        return None, "; ".join(filter(None, [problem, str(exc)]))
    return (parsed, None) if problem is None else (None, problem)


def placed(table: Mapping[str, Any]) -> bool:
    """Whether the table's status says the pool's nodes hold it (its Capacity is True)."""
    conditions = (table.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Capacity" and c.get("status") == "True" for c in conditions)


def placement_order(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order tables claim a pool's memory: those placed already, then the oldest."""

    def key(table: dict[str, Any]) -> tuple[bool, str, str]:
        meta = table["metadata"]
        return (not placed(table), meta.get("creationTimestamp") or "", meta["name"])

    return sorted(tables, key=key)


def table_spec(table: Mapping[str, Any], shards: int) -> TableSpec | None:
    """The table a pool's node holds for this resource (None when its spec is invalid)."""
    meta = table["metadata"]
    try:
        decl = parse_declaration(table.get("spec") or {}, default_name=meta["name"])
    except InvalidArgument:
        return None
    return decl.spec.model_copy(update={"shards": shards})


@dataclass
class Pools:
    """Reads and writes pools and their children through the operator's API client."""

    kube: Kube
    options: RenderOptions

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.kube.get(path(POOL_KIND, namespace, name))

    async def statefulset(self, owner: Owner) -> dict[str, Any] | None:
        return await self.kube.get(path("StatefulSet", owner.namespace, render.fleet_name(owner)))

    async def tables_on(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        """The EmbeddingTables that name the pool (those being deleted too: they are held
        until their final checkpoint)."""
        tables = await self.kube.list(path("EmbeddingTable", namespace), labels={})
        return [t for t in tables if (t.get("spec") or {}).get("pool") == pool]

    async def admission(
        self, namespace: str, pool: str, spec: PoolSpec, shards: int
    ) -> tuple[Admission, list[dict[str, Any]]]:
        """Which tables on the pool its ``shards`` nodes hold, and the tables in order."""
        tables = placement_order(await self.tables_on(namespace, pool))
        specs = [
            (t["metadata"]["name"], s)
            for t in tables
            if not (t.get("metadata") or {}).get("deletionTimestamp")
            and (s := table_spec(t, shards)) is not None
        ]
        return admit(pool, spec, specs, shards), tables

    async def apply(self, owner: Owner, spec: PoolSpec) -> None:
        """Create or update the pool's children. A running StatefulSet keeps its replicas and
        its nodes their shard count: only the pool's move changes those
        (``recstore.operator.pool_reshard``), and while its count differs from the declared
        one the pods are left on their template (an update would restart them mid-move)."""
        ns, name = owner.namespace, render.fleet_name(owner)
        await self._ensure("Service", ns, render.render_service(owner))
        sts = await self.statefulset(owner)
        desired = render.render_statefulset(owner, spec.fleet, self.options)
        if sts is None:
            await self.kube.create(path("StatefulSet", ns), desired)
        elif int(sts["spec"].get("replicas", spec.shards)) == spec.shards:
            await self.kube.patch(path("StatefulSet", ns, name), render.statefulset_update(desired))
        await self._ensure("PodDisruptionBudget", ns, render.render_pdb(owner))

    async def _ensure(self, kind: str, ns: str, desired: dict[str, Any]) -> None:
        url = path(kind, ns, desired["metadata"]["name"])
        if await self.kube.patch(url, desired) is None:
            await self.kube.create(path(kind, ns), desired)

    async def remove_children(self, owner: Owner) -> None:
        for kind in ("StatefulSet", "PodDisruptionBudget", "Service"):
            await self.kube.delete(path(kind, owner.namespace, render.fleet_name(owner)))


async def place(pools: Pools, owner: Owner, checked: Validated) -> Validated:
    """A table on a pool, placed: the declaration its pool's nodes hold (the pool's shard
    count, checkpoints and placement), or why it waits or does not fit."""
    decl = checked.declaration
    if decl is None or decl.pool is None:
        return checked
    ns, name = owner.namespace, decl.pool
    body = await pools.get(ns, name)
    if body is None:  # a pool being deleted keeps its nodes while it holds tables
        why = f"pool {name!r} does not exist in namespace {ns!r}; the table waits for it"
        return replace(checked, placing=PoolPlacing(name, waiting=why))
    spec, problem = pool_problem(name, body.get("spec") or {})
    if spec is None:
        why = f"pool {name!r} is not valid ({problem}); the table waits for it"
        return replace(checked, placing=PoolPlacing(name, waiting=why))
    refusal = table_problem_on(name, spec, StorageTier(decl.spec.storage)) or checkpoint_problem(
        name, spec, decl.spec.checkpoint
    )
    if refusal is not None:
        return Validated(None, refusal, placing=PoolPlacing(name))
    fleet = pool_owner(body)
    sts = await pools.statefulset(fleet)
    if sts is None:
        why = f"the nodes of pool {name!r} are not created yet"
        return replace(checked, placing=PoolPlacing(name, waiting=why), fleet=fleet)
    replicas = int((sts.get("spec") or {}).get("replicas", spec.shards))
    admission, _ = await pools.admission(ns, name, spec, replicas)
    table = await pools.kube.get(path("EmbeddingTable", ns, owner.name)) or {}
    shards = table_shards(table, replicas, spec.shards)
    held = decl.spec.model_copy(update={"shards": shards, "checkpoint": spec.checkpoint})
    return Validated(
        Declaration(held, spec.placement, pool=name),
        None,
        placing=PoolPlacing(name, capacity=admission.refused.get(owner.name)),
        fleet=fleet,
    )


def table_shards(table: Mapping[str, Any], replicas: int, declared: int) -> int:
    """The pool's nodes a table is spread over: its stored slot map's (a pool's move
    changes it table by table); a table not created yet, the nodes that stay (the
    fewer of those running and those declared: a shrink's nodes that go get none)."""
    stored = (table.get("status") or {}).get("slotMap")
    return SlotMap.from_dict(stored).num_shards if stored else min(replicas, declared)


def pool_of(owner: Owner, spec: Mapping[str, Any]) -> Owner:
    """Whose pods hold the table of ``spec``: its pool's (by name), else its own."""
    pool = spec.get("pool")
    if isinstance(pool, str) and pool:
        return Owner(name=pool, namespace=owner.namespace, uid="", kind=POOL_KIND)
    return owner
