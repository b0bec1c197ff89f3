"""The operator's control of online moves: start, queue, retry, and what follows a move.

``recstore.operator.resharding`` runs one move in a thread; this decides when one
runs. A new ``shards`` starts a move; another change while it runs is queued
(the ``ReshardQueued`` condition and Event) and started when that move ends, not
at the next status refresh; a failed move is tried again after the shared
policy's wait (``recstore.core.reshard.retry``, with ``OperatorConfig``'s
parameters), the status and Events saying which attempt stopped and why.
Each ``Reconciler`` holds one, handing itself in (``ReconcilerView``: the
children, the status and the tokens stay the reconciler's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from recstore.core.reconcile import Declaration, Observation, Resharding
from recstore.core.reshard.events import ReshardEvent, ReshardMoment
from recstore.core.reshard.retry import Tries
from recstore.core.status import TableStatus
from recstore.operator import render, resharding
from recstore.operator.config import OperatorConfig
from recstore.operator.declared import Validated
from recstore.operator.kube import Kube, path
from recstore.operator.render import Owner, RenderOptions
from recstore.operator.reshard_store import StatusJobStore
from recstore.operator.status import status_changed

Logger = logging.Logger | logging.LoggerAdapter
log = logging.getLogger(__name__)


class ReconcilerView(Protocol):
    """What the reshard control uses of the reconciler that holds it."""

    kube: Kube
    config: OperatorConfig
    confirmed: set[tuple[str, str, int]]
    publish: Callable[[str, dict[str, Any]], Awaitable[None]] | None
    announce: Callable[[Owner, str, ReshardEvent], Awaitable[None]] | None

    @property
    def options(self) -> RenderOptions: ...

    async def validate(self, owner: Owner, spec: Mapping[str, Any]) -> Validated: ...

    async def observe(
        self, owner: Owner, checked: Validated, logger: Logger
    ) -> tuple[Observation, list[dict[str, Any]]]: ...

    async def ps_token(self, ns: str) -> str | None: ...

    def status(
        self,
        checked: Validated,
        observation: Observation,
        *,
        generation: int,
        previous: Mapping[str, Any] | None,
        deleting: bool = False,
    ) -> TableStatus: ...


@dataclass
class ReshardControl:
    """When each table's online reshard runs: started, queued behind another, retried."""

    reconciler: ReconcilerView
    #: running (or last) reshards by table uid (recstore.operator.resharding)
    resharders: dict[str, resharding.Resharder] = field(default_factory=dict)

    async def start(
        self,
        owner: Owner,
        decl: Declaration,
        running: int,
        logger: Logger,
        fleet: Owner | None = None,
    ) -> None:
        """Start the online move to ``decl``'s shard count. A second change while one runs
        is queued (a ``ReshardQueued`` condition and Event) and started when that move
        ends; a failed move is retried after the policy's wait (``config.reshard_retry``).
        ``fleet``: the pool whose pods hold the table (None: its own StatefulSet), which
        the pool scales itself (``recstore.operator.pool_reshard``)."""
        resharder = self.resharders.get(owner.uid)
        if resharder is not None and resharder.running:
            queued_before = resharder.queued_shards
            resharder.declared = decl
            queued = resharder.queued_shards
            if queued is not None and queued != queued_before:
                logger.warning(
                    f"spec.shards is {queued} while a move to {resharder.moving_to} shards runs; "
                    "it starts once this move is done"
                )
                await self._announce_queued(owner, decl, resharder, running)
            return
        if resharder is not None:
            resharder.cancel_retry()  # a new change replaces a retry that waits
        tries = Tries(self.reconciler.config.reshard_retry)
        resharder = self.resharders[owner.uid] = resharding.Resharder(
            decl.spec.shards, decl, tries, fleet
        )
        logger.info(f"resharding {running} -> {decl.spec.shards} shards online")
        await self._start(owner, resharder, running)

    async def _start(self, owner: Owner, resharder: resharding.Resharder, running: int) -> None:
        """Start (or retry) ``resharder``'s move in its thread, for its latest declaration."""
        spec = resharder.declared.spec.model_copy(update={"shards": resharder.to_shards})
        placement = resharder.declared.placement
        loop = asyncio.get_running_loop()
        url = path("EmbeddingTable", owner.namespace, owner.name)
        rec = self.reconciler

        async def publish() -> None:
            if self.reconciler.publish is not None:
                stored = (await self.reconciler.kube.get(url)) or {}
                await self.reconciler.publish(spec.name, dict(stored.get("status") or {}))

        async def announce(event: ReshardEvent) -> None:
            if self.reconciler.announce is not None:
                await self.reconciler.announce(owner, spec.name, event)

        def template(count: int) -> dict[str, Any]:
            sized = Declaration(spec.model_copy(update={"shards": count}), placement)
            rendered: dict[str, Any] = render.render_statefulset(
                owner, sized, self.reconciler.options
            )
            return dict(rendered["spec"]["template"])

        async def ended() -> None:
            await self._after_reshard(owner, resharder)

        on_pool = resharder.fleet is not None
        shards = resharding.TableShards(
            kube=rec.kube, loop=loop, fleet=resharder.fleet or owner, spec=spec,
            port=rec.config.ps_port, template=template, scales=not on_pool,
            span=max(running, resharder.to_shards) if on_pool else None,
            token=await rec.ps_token(owner.namespace), tls=rec.config.tls,
            timeout=self.reconciler.config.rpc_timeout, publish=publish, announce=announce,
            confirm=lambda pod: rec.confirmed.add((owner.uid, *resharding.pod_key(pod))),
        )  # fmt: skip
        store = StatusJobStore(self.reconciler.kube, loop, owner.namespace, owner.name)
        resharding.start(
            resharder, shards, store, running, on_end=ended,
            batch_slots=self.reconciler.config.reshard_batch_slots,
            copy_rate=self.reconciler.config.reshard_copy_rate,
        )  # fmt: skip

    async def _after_reshard(self, owner: Owner, resharder: resharding.Resharder) -> None:
        """A move ended: retry it after its wait when it failed, else start the change
        queued behind it; then write the status (the queue emptied, the next move)."""
        if self.resharders.get(owner.uid) is not resharder:
            return  # replaced meanwhile
        if resharder.failed:
            delay = resharder.tries.retry_in_s
            if delay is not None:
                loop = asyncio.get_running_loop()
                resharder.retry = loop.call_later(
                    delay,
                    lambda: loop.create_task(resharding.logged(self._retry(owner, resharder))),
                )
        elif resharder.declared.spec.shards != resharder.moving_to:
            await self.start(owner, resharder.declared, resharder.moving_to, log, resharder.fleet)
        await self._write_status(owner)

    async def _retry(self, owner: Owner, resharder: resharding.Resharder) -> None:
        resharder.retry = None
        if (
            self.resharders.get(owner.uid) is not resharder
            or resharder.closed.is_set()
            or resharder.running
        ):
            return
        resharder.tries.again()
        log.info("resharding %s again (attempt %d)", owner.name, resharder.tries.attempt)
        running = resharder.progress.from_shards if resharder.progress else resharder.to_shards
        await self._start(owner, resharder, running)

    async def _announce_queued(
        self, owner: Owner, decl: Declaration, resharder: resharding.Resharder, running: int
    ) -> None:
        p = resharder.progress or Resharding(
            running, resharder.moving_to, 0, 0, 0, await self._stored_epoch(owner)
        )  # not planned yet
        event = ReshardEvent(
            moment=ReshardMoment.queued, from_shards=p.from_shards, to_shards=p.to_shards,
            epoch=p.epoch, slots_moved=p.slots_moved, slots_total=p.slots_total,
            bytes_moved=p.bytes_moved, queued_shards=decl.spec.shards,
            attempt=resharder.tries.attempt,
        )  # fmt: skip
        if self.reconciler.announce is not None:
            await self.reconciler.announce(owner, decl.spec.name, event)

    async def _stored_epoch(self, owner: Owner) -> int:
        body = (
            await self.reconciler.kube.get(path("EmbeddingTable", owner.namespace, owner.name))
            or {}
        )
        return int((body.get("status") or {}).get("slotMapEpoch") or 1)

    async def _write_status(self, owner: Owner) -> None:
        """The status now, outside a handler (after a move ended), as the refresh writes it."""
        url = path("EmbeddingTable", owner.namespace, owner.name)
        body = await self.reconciler.kube.get(url)
        if body is None:
            return
        checked = await self.reconciler.validate(owner, body.get("spec") or {})
        observation, _pods = await self.reconciler.observe(owner, checked, log)
        previous = body.get("status") or {}
        generation = int(
            previous.get("observedGeneration") or body["metadata"].get("generation") or 1
        )
        status = self.reconciler.status(
            checked, observation, generation=generation, previous=previous
        ).to_wire()
        status.pop("observedGeneration")  # only the apply handlers say it
        if status_changed(previous, status):
            await self.reconciler.kube.patch(f"{url}/status", {"status": status})
            if self.reconciler.publish is not None:
                table = (body.get("spec") or {}).get("name") or owner.name
                await self.reconciler.publish(table, {**previous, **status})

    def due(self, owner: Owner, checked: Validated, observation: Observation) -> bool:
        """Whether a declared shard count differs from the running one with no move running
        or waiting to be retried (a move that failed its last try is not retried by itself:
        a new change or a restart does)."""
        resharder, decl = self.resharders.get(owner.uid), checked.declaration
        held = resharder is not None and (
            resharder.running or resharder.retrying or resharder.failed
        )
        return decl is not None and not held and observation.running_shards not in (
            None, decl.spec.shards,
        )  # fmt: skip

    def stop(self) -> None:
        for resharder in self.resharders.values():
            resharder.closed.set()
            resharder.cancel_retry()
