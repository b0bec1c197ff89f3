"""The operator's control of online moves: start, queue, retry, and what follows a move.

``recstore.operator.resharding`` runs one move in a thread; this decides when one
runs. A new ``shards`` starts a move; another change while it runs is queued
(the ``ReshardQueued`` condition and Event) and started when that move ends, not
at the next status refresh; a failed move is tried again after the shared
policy's wait (``recstore.core.migration_retry``, with ``OperatorConfig``'s
parameters), the status and Events saying which attempt stopped and why.
``Reconciler`` mixes this in: the children, the status and the tokens are its.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from recstore.core.migration_events import MoveEvent, MoveMoment
from recstore.core.migration_retry import Tries
from recstore.core.reconcile import Declaration, Observation, Resharding
from recstore.core.status import TableStatus
from recstore.operator import render, resharding
from recstore.operator.config import OperatorConfig
from recstore.operator.kube import Kube, path
from recstore.operator.migration_store import StatusJobStore
from recstore.operator.render import Owner, RenderOptions
from recstore.operator.status import status_changed

if TYPE_CHECKING:
    from recstore.operator.reconciler import Validated

Logger = logging.Logger | logging.LoggerAdapter
log = logging.getLogger(__name__)


class MoveControl:
    """The move part of ``Reconciler`` (which supplies the attributes and methods below)."""

    kube: Kube
    config: OperatorConfig
    confirmed: set[tuple[str, int]]
    movers: dict[str, resharding.Mover]
    publish: Callable[[str, dict[str, Any]], Awaitable[None]] | None
    announce: Callable[[Owner, str, MoveEvent], Awaitable[None]] | None

    if TYPE_CHECKING:

        @property
        def options(self) -> RenderOptions: ...

        def validate(self, owner: Owner, spec: Mapping[str, Any]) -> Validated: ...

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

    async def reshard(self, owner: Owner, decl: Declaration, running: int, logger: Logger) -> None:
        """Start the online move to ``decl``'s shard count. A second change while one runs
        is queued (a ``ReshardQueued`` condition and Event) and started when that move
        ends; a failed move is retried after the policy's wait (``config.reshard_retry``)."""
        mover = self.movers.get(owner.uid)
        if mover is not None and mover.running:
            queued_before = mover.queued_shards
            mover.declared = decl
            queued = mover.queued_shards
            if queued is not None and queued != queued_before:
                logger.warning(
                    f"spec.shards is {queued} while a move to {mover.moving_to} shards runs; "
                    "it starts once this move is done"
                )
                await self._announce_queued(owner, decl, mover, running)
            return
        if mover is not None:
            mover.cancel_retry()  # a new change replaces a retry that waits
        tries = Tries(self.config.reshard_retry)
        mover = self.movers[owner.uid] = resharding.Mover(decl.spec.shards, decl, tries)
        logger.info(f"resharding {running} -> {decl.spec.shards} shards online")
        await self._start(owner, mover, running)

    async def _start(self, owner: Owner, mover: resharding.Mover, running: int) -> None:
        """Start (or retry) ``mover``'s move in its thread, for its latest declaration."""
        spec = mover.declared.spec.model_copy(update={"shards": mover.to_shards})
        placement = mover.declared.placement
        loop = asyncio.get_running_loop()
        url = path("EmbeddingTable", owner.namespace, owner.name)

        async def publish() -> None:
            if self.publish is not None:
                stored = (await self.kube.get(url)) or {}
                await self.publish(spec.name, dict(stored.get("status") or {}))

        async def announce(event: MoveEvent) -> None:
            if self.announce is not None:
                await self.announce(owner, spec.name, event)

        def template(count: int) -> dict[str, Any]:
            sized = Declaration(spec.model_copy(update={"shards": count}), placement)
            rendered: dict[str, Any] = render.render_statefulset(owner, sized, self.options)
            return dict(rendered["spec"]["template"])

        async def ended() -> None:
            await self._after_move(owner, mover)

        shards = resharding.TableShards(
            kube=self.kube, loop=loop, owner=owner, spec=spec, port=self.config.ps_port,
            template=template,
            token=await self.ps_token(owner.namespace), tls=self.config.tls,
            timeout=self.config.rpc_timeout, publish=publish, announce=announce,
            confirm=lambda pod: self.confirmed.add(resharding.pod_key(pod)),
        )  # fmt: skip
        store = StatusJobStore(self.kube, loop, owner.namespace, owner.name)
        resharding.start(
            mover, shards, store, running, on_end=ended,
            batch_slots=self.config.reshard_batch_slots,
            copy_rate=self.config.reshard_copy_rate,
        )  # fmt: skip

    async def _after_move(self, owner: Owner, mover: resharding.Mover) -> None:
        """A move ended: retry it after its wait when it failed, else start the change
        queued behind it; then write the status (the queue emptied, the next move)."""
        if self.movers.get(owner.uid) is not mover:
            return  # replaced meanwhile
        if mover.failed:
            delay = mover.tries.retry_in_s
            if delay is not None:
                loop = asyncio.get_running_loop()
                mover.retry = loop.call_later(
                    delay, lambda: loop.create_task(resharding.logged(self._retry(owner, mover)))
                )
        elif mover.declared.spec.shards != mover.moving_to:
            await self.reshard(owner, mover.declared, mover.moving_to, log)
        await self._write_status(owner)

    async def _retry(self, owner: Owner, mover: resharding.Mover) -> None:
        mover.retry = None
        if self.movers.get(owner.uid) is not mover or mover.closed.is_set() or mover.running:
            return
        mover.tries.again()
        log.info("resharding %s again (attempt %d)", owner.name, mover.tries.attempt)
        running = mover.progress.from_shards if mover.progress else mover.to_shards
        await self._start(owner, mover, running)

    async def _announce_queued(
        self, owner: Owner, decl: Declaration, mover: resharding.Mover, running: int
    ) -> None:
        p = mover.progress or Resharding(
            running, mover.moving_to, 0, 0, 0, await self._stored_epoch(owner)
        )  # not planned yet
        event = MoveEvent(
            moment=MoveMoment.queued, from_shards=p.from_shards, to_shards=p.to_shards,
            epoch=p.epoch, slots_moved=p.slots_moved, slots_total=p.slots_total,
            bytes_moved=p.bytes_moved, queued_shards=decl.spec.shards, attempt=mover.tries.attempt,
        )  # fmt: skip
        if self.announce is not None:
            await self.announce(owner, decl.spec.name, event)

    async def _stored_epoch(self, owner: Owner) -> int:
        body = await self.kube.get(path("EmbeddingTable", owner.namespace, owner.name)) or {}
        return int((body.get("status") or {}).get("slotMapEpoch") or 1)

    async def _write_status(self, owner: Owner) -> None:
        """The status now, outside a handler (after a move ended), as the refresh writes it."""
        url = path("EmbeddingTable", owner.namespace, owner.name)
        body = await self.kube.get(url)
        if body is None:
            return
        checked = self.validate(owner, body.get("spec") or {})
        observation, _pods = await self.observe(owner, checked, log)
        previous = body.get("status") or {}
        generation = int(
            previous.get("observedGeneration") or body["metadata"].get("generation") or 1
        )
        status = self.status(
            checked, observation, generation=generation, previous=previous
        ).to_wire()
        status.pop("observedGeneration")  # only the apply handlers say it
        if status_changed(previous, status):
            await self.kube.patch(f"{url}/status", {"status": status})
            if self.publish is not None:
                table = (body.get("spec") or {}).get("name") or owner.name
                await self.publish(table, {**previous, **status})

    def move_due(self, owner: Owner, checked: Validated, observation: Observation) -> bool:
        """Whether a declared shard count differs from the running one with no move running
        or waiting to be retried (a move that failed its last try is not retried by itself:
        a new change or a restart does)."""
        mover, decl = self.movers.get(owner.uid), checked.declaration
        held = mover is not None and (mover.running or mover.retrying or mover.failed)
        return decl is not None and not held and observation.running_shards not in (
            None, decl.spec.shards,
        )  # fmt: skip

    def stop_moves(self) -> None:
        for mover in self.movers.values():
            mover.closed.set()
            mover.cancel_retry()
