"""The operator's reconcile procedures: observe, call the pure core, apply.

Each procedure reads the children through ``Kube``, asks the reconcile core
(``recstore.core.reconcile``) and the renderers what should exist and what
the status is, and writes only the difference. kopf handlers call these
with the resource's fields; nothing here depends on kopf's calling style.
Online reshards (start, queue, retry) are ``recstore.operator.reshard_control``'s and
checkpoints asked for on demand ``recstore.operator.checkpoint_requests``'s: collaborators
each ``Reconciler`` holds.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from recstore.core.checkpoint_status import ShardCheckpoint
from recstore.core.control import CREATE_REFUSALS
from recstore.core.reconcile import Declaration, Observation, compute_status
from recstore.core.reshard.events import ReshardEvent
from recstore.core.routing import SlotMap
from recstore.core.status import TableStatus
from recstore.operator import final_checkpoint, render, resharding
from recstore.operator.checkpoint_requests import CheckpointRequests
from recstore.operator.config import OperatorConfig
from recstore.operator.declared import Validated, validate
from recstore.operator.kube import Kube, path
from recstore.operator.pool_reshard import PoolMoves
from recstore.operator.pools import Pools, place, pool_of
from recstore.operator.render import Owner, RenderOptions
from recstore.operator.reshard_control import ReshardControl
from recstore.operator.status import observe, pod_ready

Logger = logging.Logger | logging.LoggerAdapter
log = logging.getLogger(__name__)


@dataclass
class Reconciler:
    kube: Kube
    config: OperatorConfig
    #: (table uid, pod uid, restart count): the shards each table is known to exist on
    #: (a pool's pod holds many tables)
    confirmed: set[tuple[str, str, int]] = field(default_factory=set)
    #: mirrors a table's stored status to the admin API (the new map after a commit)
    publish: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
    #: posts a moment of a reshard (owner, table name, event): Kubernetes Event, audit log
    announce: Callable[[Owner, str, ReshardEvent], Awaitable[None]] | None = None
    #: the checkpoints asked for on demand, taken from the resource's annotation
    checkpoints: CheckpointRequests = field(init=False)
    #: the tables' online reshards: started, queued and retried there
    reshards: ReshardControl = field(init=False)
    #: the pools tables are placed on
    pools: Pools = field(init=False)
    #: the pools' moves to a new shard count (each of their tables through ``reshards``)
    pool_moves: PoolMoves = field(init=False)

    def __post_init__(self) -> None:
        self.checkpoints = CheckpointRequests(
            lambda owner, checkpoint_id, logger: self.save_shards(
                owner, checkpoint_id, logger, every_shard=True
            )
        )
        self.reshards = ReshardControl(self)
        self.pools = Pools(self.kube, self.options)
        self.pool_moves = PoolMoves(self)

    @property
    def options(self) -> RenderOptions:
        return RenderOptions(
            default_image=self.config.ps_image,
            token_secret=self.config.ps_token_secret,
            read_only_token_secret=self.config.ps_read_only_token_secret,
            cluster_domain=self.config.cluster_domain,
            tls_secret=self.config.ps_tls_secret,
            tls_mutual=self.config.ps_tls_mutual,
        )

    async def validate(self, owner: Owner, spec: Mapping[str, Any]) -> Validated:
        """The declaration; a table on a pool placed there (``recstore.operator.pools``)."""
        return await place(self.pools, owner, validate(owner, spec, self.config))

    async def apply(
        self,
        owner: Owner,
        spec: Mapping[str, Any],
        logger: Logger,
        status: Mapping[str, Any] | None = None,
    ) -> Validated:
        """Create or update the children; a changed shard count (or a stored unfinished
        move, ``status``) starts an online move instead; nothing when invalid."""
        checked = await self.validate(owner, spec)
        decl = checked.declaration
        if decl is None:
            logger.error(f"invalid EmbeddingTable, nothing changed: {checked.problem}")
            return checked
        if checked.fleet is not None or checked.placing is not None:
            return checked  # on a pool: its nodes are the pool's, the table is created there
        name, ns = render.workload_name(owner.name), owner.namespace
        sts = await self.kube.get(path("StatefulSet", ns, name))
        unfinished = ((status or {}).get("migrationJob") or {}).get("phase") not in (None, "done")
        if sts is not None and (
            unfinished or int(sts["spec"].get("replicas", 1)) != decl.spec.shards
        ):
            await self.reshards.start(owner, decl, int(sts["spec"].get("replicas", 1)), logger)
            return checked
        await self._ensure("Service", ns, render.render_service(owner))
        desired = render.render_statefulset(owner, decl, self.options)
        if sts is None:
            await self.kube.create(path("StatefulSet", ns), desired)
        else:
            await self.kube.patch(path("StatefulSet", ns, name), render.statefulset_update(desired))
        await self._ensure("PodDisruptionBudget", ns, render.render_pdb(owner))
        return checked

    async def _ensure(self, kind: str, ns: str, desired: dict[str, Any]) -> None:
        url = path(kind, ns, desired["metadata"]["name"])
        if await self.kube.patch(url, desired) is None:
            await self.kube.create(path(kind, ns), desired)

    async def observe(
        self, owner: Owner, checked: Validated, logger: Logger
    ) -> tuple[Observation, list[dict[str, Any]]]:
        """What runs; a ready pod counts as a ready shard once the table exists on it."""
        if checked.held:  # on a pool that is not there, or too large for it: nothing runs
            return Observation(pool=checked.placing), []
        fleet, decl = checked.runs_on(owner), checked.declaration
        ns, name = owner.namespace, render.fleet_name(fleet)
        sts = await self.kube.get(path("StatefulSet", ns, name))
        pods = (
            []
            if sts is None
            else await self.kube.list(path("Pod", ns), labels=render.selector_labels(fleet))
        )
        resharder = self.reshards.resharders.get(owner.uid)
        if sts is not None and decl is not None and checked.fleet is not None:
            # a pool's nodes beyond the table's slot map (a pool growing) do not hold it
            # until its own move spans them
            spans = decl.spec.shards
            if resharder is not None and resharder.running and resharder.progress is not None:
                spans = max(spans, resharder.progress.from_shards, resharder.progress.to_shards)
            sts = {**sts, "spec": {**sts.get("spec", {}), "replicas": spans}}
            pods = [p for p in pods if _pod_index(p) < spans]
        refused = None
        if decl is not None:
            refused = await self._create_table_on_new_shards(owner, decl, pods, logger)
        usable = [p for p in pods if not pod_ready(p) or self._key(owner, p) in self.confirmed]
        unconfirmed = [_without_ready(p) for p in pods if p not in usable]
        endpoint = lambda i: render.shard_endpoint(fleet, i, self.options)  # noqa: E731
        observation = observe(sts, usable + unconfirmed, endpoint)
        if refused is not None:
            observation = dataclasses.replace(observation, refused=refused)
        if checked.placing is not None:
            observation = dataclasses.replace(observation, pool=checked.placing)
        if resharder is not None and resharder.progress is not None:
            observation = dataclasses.replace(
                observation, resharding=resharder.progress, queued_shards=resharder.queued_shards
            )
        request, completed = self.checkpoints.progress(owner.uid)
        observation = dataclasses.replace(
            observation, checkpoint_request=request, last_checkpoint=completed
        )
        return observation, pods

    async def _create_table_on_new_shards(
        self, owner: Owner, decl: Declaration, pods: list[dict[str, Any]], logger: Logger
    ) -> str | None:
        """CreateTable on each ready shard not known to host the table; returns a node's
        refusal (its words), which holds until a later call finds the table served."""
        todo = [p for p in pods if pod_ready(p) and self._key(owner, p) not in self.confirmed]
        shards = [(_pod_index(p), self._address(p)) for p in todo if p["status"].get("podIP")]
        if not shards:
            return None
        ns = owner.namespace
        token = await self.ps_token(ns)
        # a table moved online: a new (or restarted) shard joins with the committed map
        url = path("EmbeddingTable", ns, owner.name)
        table = await self.kube.get(url) or {}
        stored = (table.get("status") or {}).get("slotMap")
        slot_map = SlotMap.from_dict(stored) if stored else None
        if slot_map is None and decl.pool is not None:
            # a pool's nodes hold tables of any count: the map is stored before any node
            # holds it, so the pool's move knows where each of its tables starts
            slot_map = SlotMap.initial(decl.spec.shards)
            status = {"slotMap": slot_map.to_dict(), "slotMapEpoch": slot_map.epoch}
            await self.kube.patch(f"{url}/status", {"status": status})
        results = await final_checkpoint.create_table_on(
            shards, decl.spec, token=token, timeout=self.config.rpc_timeout, tls=self.config.tls,
            slot_map=slot_map,
        )  # fmt: skip
        refusals = []
        for pod, result in zip(todo, results, strict=False):
            if result.ok:
                self.confirmed.add(self._key(owner, pod))
            else:
                logger.warning(f"table not created on shard {result.index}: {result.detail}")
                if result.code in CREATE_REFUSALS:
                    refusals.append(
                        f"shard {result.index} ({result.address}) refused it: {result.detail}"
                    )
        return refusals[0] if refusals else None

    @staticmethod
    def _key(owner: Owner, pod: Mapping[str, Any]) -> tuple[str, str, int]:
        return (owner.uid, *_pod_key(pod))

    def _address(self, pod: Mapping[str, Any]) -> str:
        ip = pod["status"]["podIP"]
        return f"[{ip}]:{self.config.ps_port}" if ":" in ip else f"{ip}:{self.config.ps_port}"

    async def ps_token(self, ns: str) -> str | None:
        if not self.config.ps_token_secret:
            return None
        secret = await self.kube.get(path("Secret", ns, self.config.ps_token_secret))
        data = (secret or {}).get("data") or {}
        return base64.b64decode(data["token"]).decode().strip() if "token" in data else None

    def status(
        self,
        checked: Validated,
        observation: Observation,
        *,
        generation: int,
        previous: Mapping[str, Any] | None,
        deleting: bool = False,
    ) -> TableStatus:
        """The status from what runs; ``previous``: the resource's stored status."""
        decl = checked.declaration
        return compute_status(
            problem=checked.problem,
            declared_shards=decl.spec.shards if decl else None,
            observation=observation,
            generation=generation,
            previous=TableStatus.from_stored(previous),
            now=dt.datetime.now(dt.timezone.utc),
            deleting=deleting,
        )

    async def save_shards(
        self, owner: Owner, checkpoint_id: str, logger: Logger, *, every_shard: bool
    ) -> list[ShardCheckpoint]:
        """Save every serving shard under ``checkpoint_id``. ``every_shard``: a shard of the
        StatefulSet that does not serve is listed too, failed (an on-demand checkpoint is
        of the whole table); else only the serving ones are asked (the final checkpoint)."""
        table = await self.kube.get(path("EmbeddingTable", owner.namespace, owner.name)) or {}
        spec = table.get("spec") or {}
        fleet = pool_of(owner, spec)
        # a pool's nodes hold its other tables too: this table is saved alone
        alone = [str(spec.get("name") or owner.name)] if fleet is not owner else []
        pods = await self.kube.list(
            path("Pod", owner.namespace), labels=render.selector_labels(fleet)
        )
        serving = {_pod_index(p): p for p in pods if pod_ready(p) and p["status"].get("podIP")}
        token = await self.ps_token(owner.namespace)
        results = await final_checkpoint.save_all(
            [(index, self._address(pod)) for index, pod in sorted(serving.items())],
            checkpoint_id=checkpoint_id,
            tables=alone,
            token=token,
            timeout=self.config.save_timeout,
            tls=self.config.tls,
        )
        if every_shard:
            sts = await self.kube.get(
                path("StatefulSet", owner.namespace, render.fleet_name(fleet))
            )
            replicas = int((sts or {}).get("spec", {}).get("replicas", 0))
            results += [
                ShardCheckpoint(index=i, error="the shard does not serve: its pod is not ready")
                for i in range(replicas)
                if i not in serving
            ]
        for r in results:
            say = logger.info if r.ok else logger.warning
            say(f"checkpoint {checkpoint_id} of shard {r.index}: {r.error or 'saved'}")
        return sorted(results, key=lambda r: r.index)

    async def remove_children(self, owner: Owner, spec: Mapping[str, Any]) -> None:
        """Remove what holds the table: its own fleet, or the table from its pool's nodes
        (the pool's other tables untouched)."""
        fleet = pool_of(owner, spec)
        if fleet is not owner:
            pods = await self.kube.list(
                path("Pod", owner.namespace), labels=render.selector_labels(fleet)
            )
            serving = [(_pod_index(p), self._address(p)) for p in pods if pod_ready(p)]
            name = str(spec.get("name") or owner.name)
            token = await self.ps_token(owner.namespace)
            await final_checkpoint.drop_table_on(
                serving, name, token=token, timeout=self.config.rpc_timeout, tls=self.config.tls
            )
            self.confirmed = {key for key in self.confirmed if key[0] != owner.uid}
            return
        name, ns = render.workload_name(owner.name), owner.namespace
        for kind in ("StatefulSet", "PodDisruptionBudget", "Service"):
            await self.kube.delete(path(kind, ns, name))


_pod_key = resharding.pod_key
_pod_index = resharding.pod_index


def _without_ready(pod: Mapping[str, Any]) -> dict[str, Any]:
    status = dict(pod.get("status") or {})
    status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
    return {**pod, "status": status}
