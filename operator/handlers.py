"""kopf handlers for EmbeddingTable: thin wrappers around the Reconciler.

``register(registry, config)`` puts every handler into a kopf registry (a
fresh one per test and per ``recstore operator`` run; kopf's default one in
``kopf run -m recstore.operator.main``). Create, update and resume apply
the children and write the status; a timer refreshes the status from the
StatefulSet and pods and takes a checkpoint request the admin API annotated;
delete takes a final checkpoint, then removes the children and releases the
finalizer. An online move's moments become Kubernetes Events and admin audit
events through ``announce``.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

import kopf

from recstore.core import checkpoint_status
from recstore.core.checkpoint_status import outcome
from recstore.core.reshard.events import ReshardEvent
from recstore.core.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION
from recstore.core.status import TableStatus
from recstore.operator import pool_handlers
from recstore.operator.admin_mirror import AdminMirror
from recstore.operator.config import OperatorConfig
from recstore.operator.kube import Kube, path
from recstore.operator.reconciler import Reconciler
from recstore.operator.render import Owner
from recstore.operator.status import applied_generation_current, status_changed

FINALIZER = f"{GROUP}/final-checkpoint"
RESOURCE = (GROUP, VERSION, PLURAL)


@dataclass
class _State:
    config: OperatorConfig
    reconciler: Reconciler | None = None
    mirror: AdminMirror | None = None
    stopping: bool = False

    def get(self) -> Reconciler:
        if self.stopping:
            raise kopf.TemporaryError("the operator is stopping", delay=60)
        if self.reconciler is None:
            raise kopf.TemporaryError("not logged in to the API server yet", delay=1)
        return self.reconciler


def _owner(body: kopf.Body) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def _table(body: kopf.Body) -> str:
    """The table's name (the spec's; the resource's when it names none)."""
    return str((body.get("spec") or {}).get("name") or body["metadata"]["name"])


def final_checkpoint_id(deletion_timestamp: str | None) -> str:
    """One id for every shard and every retry: derived from when deletion was requested."""
    when = dt.datetime.now(dt.timezone.utc)
    if deletion_timestamp:
        when = dt.datetime.fromisoformat(deletion_timestamp.replace("Z", "+00:00"))
    return checkpoint_status.final_checkpoint_id(when)


def register(registry: kopf.OperatorRegistry, config: OperatorConfig | None = None) -> None:
    state = _State(config or OperatorConfig.from_env())
    pool_handlers.register(registry, state.config, state.get)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        settings.posting.level = logging.WARNING
        if state.config.admin_url:
            state.mirror = AdminMirror(
                state.config.admin_url, state.config.read_provisioner_token, tls=state.config.tls
            )

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
        if info is not None:
            state.reconciler = Reconciler(
                Kube(info), state.config, publish=mirror_stored, announce=announce
            )
        return info

    async def announce(owner: Owner, table: str, event: ReshardEvent) -> None:
        """A moment of a move: a Kubernetes Event on the EmbeddingTable, and the audit log."""
        ref = kopf.Body({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": owner.name, "namespace": owner.namespace, "uid": owner.uid},
        })  # fmt: skip
        kind = "Warning" if event.warning else "Normal"
        logger = logging.getLogger(__name__)
        try:  # best effort: a moment not recorded never stops or fails a move
            # kopf.event, not kopf.info: the posting level (WARNING) is for kopf's own lines
            kopf.event(ref, type=kind, reason=event.reason_code, message=event.message())
            if state.mirror is not None and not state.stopping:
                await state.mirror.post_event(table, event, logger)
        except Exception as error:  # e.g. the mirror closed while the operator stops
            logger.warning(f"{event.action} of {table!r} not recorded: {error}")

    async def mirror_stored(table: str, status: dict[str, Any]) -> None:
        """The status as stored (a move's new map) to the admin API."""
        stored = TableStatus.from_stored(status)
        if state.mirror is not None and stored is not None:
            await state.mirror.put_status(table, stored, logging.getLogger(__name__))

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        state.stopping = True
        if state.reconciler is not None:
            state.reconciler.reshards.stop()
            state.reconciler.checkpoints.stop()
            await state.reconciler.kube.aclose()
        if state.mirror is not None:
            await state.mirror.aclose()

    async def publish(body: kopf.Body, patch: kopf.Patch, new: dict[str, Any], logger: Any) -> None:
        """Write a changed status (``new``: its wire form) and mirror it; mirror it again
        unchanged when the last one did not reach the admin API."""
        table, stored = _table(body), dict(body.get("status") or {})
        changed = status_changed(stored, new)
        if changed:
            patch.status.update(new)
        if state.mirror is not None and (changed or state.mirror.behind(table)):
            status = TableStatus.from_stored({**stored, **new})  # with a move's stored map
            if status is not None:
                await state.mirror.put_status(table, status, logger)

    async def reconcile(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
        rec, owner = state.get(), _owner(body)
        checked = await rec.apply(owner, body.get("spec") or {}, logger, body.get("status"))
        observation, _pods = await rec.observe(owner, checked, logger)
        generation = int(body["metadata"].get("generation") or 1)
        status = rec.status(
            checked, observation, generation=generation, previous=body.get("status")
        )
        await publish(body, patch, status.to_wire(), logger)

    backoff = state.config.retry_delay
    kopf.on.create(*RESOURCE, id="apply-create", backoff=backoff, registry=registry)(reconcile)
    kopf.on.update(*RESOURCE, id="apply-update", backoff=backoff, field="spec", registry=registry)(
        reconcile
    )
    kopf.on.resume(*RESOURCE, id="apply-resume", backoff=backoff, registry=registry)(reconcile)

    @kopf.timer(*RESOURCE, interval=state.config.status_interval, idle=0, registry=registry)
    async def refresh(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
        rec, owner = state.get(), _owner(body)
        if body["metadata"].get("deletionTimestamp"):
            return  # the finalizer takes the last checkpoint and writes the status
        rec.checkpoints.take(owner, body, logger)
        if not applied_generation_current(body):
            return  # a spec change is being applied: its handler writes the status
        checked = await rec.validate(owner, body.get("spec") or {})
        observation, _pods = await rec.observe(owner, checked, logger)
        previous = body.get("status") or {}
        if rec.reshards.due(owner, checked, observation):  # a change that waited for the last move
            await rec.apply(owner, body.get("spec") or {}, logger, previous)
        # The status describes the generation the children were last applied for.
        generation = int(
            previous.get("observedGeneration") or body["metadata"].get("generation") or 1
        )
        status = rec.status(checked, observation, generation=generation, previous=previous)
        # Only the apply handlers say which generation is applied: a refresh that read its
        # body before an apply published must not put the older generation back.
        wire = status.to_wire()
        wire.pop("observedGeneration")
        await publish(body, patch, wire, logger)

    @kopf.on.delete(*RESOURCE, id="finalize", backoff=backoff, registry=registry)
    async def finalize(body: kopf.Body, retry: int, logger: Any, **_: Any) -> None:
        rec, owner = state.get(), _owner(body)
        abandoned = rec.checkpoints.abandon(owner, body)
        checked = await rec.validate(owner, body.get("spec") or {})
        observation, _pods = await rec.observe(owner, checked, logger)
        generation = int(body["metadata"].get("generation") or 1)
        deleting = rec.status(
            checked, observation, generation=generation, previous=body.get("status"), deleting=True
        )
        if abandoned is not None:
            deleting = deleting.model_copy(update={"checkpoint_request": abandoned})
        url = path("EmbeddingTable", owner.namespace, owner.name, "status")
        await rec.kube.patch(url, {"status": deleting.to_wire()})
        checkpoint_id = final_checkpoint_id(body["metadata"].get("deletionTimestamp"))
        shards = await rec.save_shards(owner, checkpoint_id, logger, every_shard=False)
        failed = [s.index for s in shards if not s.ok]
        if failed and retry < state.config.checkpoint_retries:
            raise kopf.TemporaryError(
                f"final checkpoint failed on shards {failed}", delay=state.config.retry_delay
            )
        if failed:
            logger.error(f"deleting without a final checkpoint of shards {failed}")
        if shards and not failed:
            last = outcome(checkpoint_id, shards, now=dt.datetime.now(dt.timezone.utc))
            deleting = deleting.model_copy(update={"last_checkpoint": last})
            await rec.kube.patch(url, {"status": {"lastCheckpoint": last.to_wire()}})
        if state.mirror is not None:
            await state.mirror.put_status(_table(body), deleting, logger)
        await rec.remove_children(owner, body.get("spec") or {})
