"""Online resharding on Kubernetes: an EmbeddingTable's move to a new ``shards``.

The same sequence as the local platform (``recstore.core.reshard.drive``):
growing scales the StatefulSet up first and waits until each new pod is Ready
and serves the table (created with the stored slot map, so it owns no slot
yet); the batches move; shrinking empties the highest shards and only then
scales the StatefulSet down. The slot map and the job live in the CR status
(``StatusJobStore``), so a restarted operator finishes a committed batch or
aborts another, and moves the rest. The move runs in a thread of its own;
API calls go back to kopf's loop, so the event loop never waits on a batch.
The thread runs in a copy of the starting handler's context, so the move's
moments (``recstore.core.reshard.events``) can be posted as Kubernetes Events
through kopf; when it ends, ``on_end`` runs on kopf's loop (a queued change
starts, a failed move is retried).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from recstore.core.control import ControlClient, ControlError, create_table_rpc, stats_rpc
from recstore.core.reconcile import Declaration, Resharding
from recstore.core.reshard.drive import Shards, count_failed_try, reshard
from recstore.core.reshard.events import ReshardEvent
from recstore.core.reshard.plan import DEFAULT_BATCH_SLOTS
from recstore.core.reshard.retry import Tries
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec
from recstore.core.tls import ClientTls
from recstore.operator import render
from recstore.operator.kube import Kube, path
from recstore.operator.render import Owner
from recstore.operator.reshard_store import StatusJobStore, call_on
from recstore.operator.status import pod_ready

log = logging.getLogger(__name__)
T = TypeVar("T")

#: how often the resharder looks again at pods that are not Ready yet
POLL_S = 0.2


@dataclass
class Resharder:
    """One table's move: its thread, the progress the status shows, how to stop it.

    ``declared`` is the latest declaration seen while it runs: one asking for another
    shard count is queued (``queued_shards``) and started when this move ends.
    ``tries`` counts the tries of this change (``recstore.core.reshard.retry``);
    ``retry`` is the next one's timer.
    """

    to_shards: int
    declared: Declaration
    tries: Tries
    #: whose StatefulSet and pods hold the table: its pool's (None: its own)
    fleet: Owner | None = None
    closed: threading.Event = field(default_factory=threading.Event)
    progress: Resharding | None = None
    thread: threading.Thread | None = None
    ended: threading.Event = field(default_factory=threading.Event)
    retry: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and not self.ended.is_set()

    @property
    def retrying(self) -> bool:
        return self.retry is not None and not self.retry.cancelled()

    @property
    def moving_to(self) -> int:
        """The count this move ends at (a resumed stored job's, which may differ)."""
        return self.progress.to_shards if self.progress is not None else self.to_shards

    @property
    def queued_shards(self) -> int | None:
        shards = self.declared.spec.shards
        return shards if shards != self.moving_to and (self.running or self.retrying) else None

    @property
    def failed(self) -> bool:
        return self.progress is not None and self.progress.error is not None

    def cancel_retry(self) -> None:
        if self.retry is not None:
            self.retry.cancel()


@dataclass
class TableShards:
    """A table's shards as pods of the StatefulSet it runs on (its own, or its pool's),
    seen from the resharder's thread. A pool's node count is the pool's to change
    (``recstore.operator.pool_reshard``: grown before its tables move, shrunk after
    all of them): ``scales`` is False there, and the move only waits for the nodes."""

    kube: Kube
    loop: asyncio.AbstractEventLoop
    #: the owner of the StatefulSet and pods: the table's own, or its pool's
    fleet: Owner
    spec: TableSpec
    port: int
    token: str | None
    tls: ClientTls | None
    timeout: float
    template: Callable[[int], dict[str, Any]]  # the pod template for this shard count
    confirm: Callable[[dict[str, Any]], None]  # the table exists on this pod
    publish: Callable[[], Coroutine[Any, Any, None]]  # mirror the status (the new map) now
    #: post a moment of the move (Kubernetes Event, admin audit log)
    announce: Callable[[ReshardEvent], Coroutine[Any, Any, None]]
    #: the move scales the StatefulSet itself (a table's own fleet)
    scales: bool = True
    #: the pods the move spans (a pool's may have more, moving to another count)
    span: int | None = None

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return call_on(self.loop, coro)

    @property
    def _sts(self) -> str:
        return path("StatefulSet", self.fleet.namespace, render.fleet_name(self.fleet))

    def pods(self) -> dict[int, dict[str, Any]]:
        labels = render.selector_labels(self.fleet)
        pods = self._call(self.kube.list(path("Pod", self.fleet.namespace), labels=labels))
        return {pod_index(p): p for p in pods}

    def address(self, pod: dict[str, Any]) -> str:
        ip = pod["status"]["podIP"]
        return f"[{ip}]:{self.port}" if ":" in ip else f"{ip}:{self.port}"

    def endpoints(self) -> list[str]:
        pods = self.pods()
        return [self.address(pods[i]) for i in sorted(pods)][: self.span]

    def replicas(self) -> int:
        sts = self._call(self.kube.get(self._sts)) or {}
        return int((sts.get("spec") or {}).get("replicas", 0))

    def scale(self, count: int) -> None:
        self._call(self.kube.patch(self._sts, {"spec": {"replicas": count}}))

    def grow_to(self, count: int) -> None:
        """Add pods sized for ``count`` shards (a node refuses an index beyond its count);
        the partition keeps the running pods on their template, so none restarts."""
        running = self.replicas()
        if self.scales and running < count:
            self._call(self.kube.patch(self._sts, grow_patch(running, count, self.template(count))))

    def shrink_to(self, count: int) -> None:
        if self.scales and self.replicas() > count:
            self.scale(count)

    def _client(self, address: str) -> ControlClient:
        return ControlClient(address, token=self.token, timeout=self.timeout, tls=self.tls)

    def serving(self, shard: int, slot_map: SlotMap) -> bool:
        pod = self.pods().get(shard)
        if pod is None or not pod_ready(pod) or not pod["status"].get("podIP"):
            return False
        try:
            with self._client(self.address(pod)) as client:
                try:
                    client.call(stats_rpc(self.spec.name))  # it holds the table already
                except ControlError:
                    client.call(create_table_rpc(self.spec, slot_map))  # a new shard
        except ControlError as error:
            log.warning("table %r not created on shard %d: %s", self.spec.name, shard, error)
            return False
        self.confirm(pod)
        return True

    def served_map(self, shards: int, closed: threading.Event) -> SlotMap | None:
        """The map every running shard serves (they agree before a first move)."""
        while not closed.wait(POLL_S):
            pods = self.pods()
            maps = set()
            for shard in range(shards):
                pod = pods.get(shard)
                if pod is None or not pod_ready(pod) or not pod["status"].get("podIP"):
                    break
                try:
                    with self._client(self.address(pod)) as client:
                        maps.add(client.call(stats_rpc(self.spec.name)).slot_map)
                except ControlError:
                    break
            else:
                if len(maps) == 1 and None not in maps:
                    return maps.pop()
        return None

    def report(self) -> None:
        self._call(self.publish())

    def record(self, event: ReshardEvent) -> None:
        self._call(self.announce(event))


def start(
    resharder: Resharder,
    shards: TableShards,
    store: StatusJobStore,
    running: int,
    on_end: Callable[[], Awaitable[None]],
    batch_slots: int = DEFAULT_BATCH_SLOTS,
    copy_rate: float = 0.0,
) -> None:
    """Run the move in a thread of its own (``resharder.thread``); ``on_end`` then runs on
    kopf's loop (a failed try's wait is ``resharder.tries.retry_in_s``)."""

    def show(progress: Resharding) -> None:
        resharder.progress = progress

    def run() -> None:
        try:
            if store.stored_map() is None:
                served = shards.served_map(running, resharder.closed)
                if served is None:
                    return  # stopping before the shards served
                store.initialise(served)
            drive = Shards(
                name=shards.spec.name, endpoints=shards.endpoints, grow_to=shards.grow_to,
                serving=shards.serving, shrink_to=shards.shrink_to, report=shards.report,
                show=show, tls=shards.tls, closed=resharder.closed, token=shards.token,
                record=shards.record,
            )  # fmt: skip
            reshard(drive, store, resharder.to_shards, batch_slots, resharder.tries, copy_rate)
        except Exception as error:  # the API server gone: retried like a failed move
            log.exception("resharding %s stopped", shards.spec.name)
            # before the job was planned, no slot map was stored yet: epoch 1
            shown = resharder.progress or Resharding(running, resharder.to_shards, 0, 0, 0, 1)
            tries = resharder.tries
            count_failed_try(tries, shown.slots_moved, resharder.closed)
            show(dataclasses.replace(
                shown, running=False, error=str(error), attempt=tries.attempt,
                retry_in_s=tries.retry_in_s,
            ))  # fmt: skip
        finally:
            if not resharder.closed.is_set() and not shards.loop.is_closed():
                resharder.ended.set()  # before on_end: it may start the next move
                asyncio.run_coroutine_threadsafe(logged(on_end()), shards.loop)
            resharder.ended.set()

    # a copy of the handler's context: kopf's event posting reads it (contextvars)
    context = contextvars.copy_context()
    resharder.ended.clear()
    resharder.thread = threading.Thread(
        target=context.run, args=(run,), name=f"reshard-{shards.spec.name}", daemon=True
    )
    resharder.thread.start()


def grow_patch(running: int, count: int, template: dict[str, Any]) -> dict[str, Any]:
    """The StatefulSet patch adding pods up to ``count`` on ``template`` (rendered for that
    count); ``partition`` keeps the ``running`` pods on their revision, so none restarts."""
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"partition": running}}
    return {"spec": {"replicas": count, "updateStrategy": strategy, "template": template}}


async def logged(work: Awaitable[None]) -> None:
    try:
        await work
    except Exception:  # nothing waits for it: say it here
        log.exception("after a move")


def pod_key(pod: Mapping[str, Any]) -> tuple[str, int]:
    """A pod incarnation: its uid and restart count (a restarted node lost its tables)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    return (pod["metadata"].get("uid") or pod["metadata"]["name"], restarts)


def pod_index(pod: Mapping[str, Any]) -> int:
    label = (pod["metadata"].get("labels") or {}).get(render.POD_INDEX_LABEL)
    return int(label) if label is not None else int(pod["metadata"]["name"].rsplit("-", 1)[1])
