"""Online resharding on Kubernetes: an EmbeddingTable's move to a new ``shards``.

The same sequence as the local platform (``recstore.core.migration_drive``):
growing scales the StatefulSet up first and waits until each new pod is Ready
and serves the table (created with the stored slot map, so it owns no slot
yet); the batches move; shrinking empties the highest shards and only then
scales the StatefulSet down. The slot map and the job live in the CR status
(``StatusJobStore``), so a restarted operator finishes a committed batch or
aborts another, and moves the rest. The move runs in a thread of its own;
API calls go back to kopf's loop, so the event loop never waits on a batch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from recstore.core.control import ControlClient, ControlError, create_table_rpc, stats_rpc
from recstore.core.migration_drive import Shards, move
from recstore.core.reconcile import Resharding
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec
from recstore.core.tls import ClientTls
from recstore.operator import render
from recstore.operator.kube import Kube, path
from recstore.operator.migration_store import StatusJobStore, call_on
from recstore.operator.render import Owner
from recstore.operator.status import pod_ready

log = logging.getLogger(__name__)
T = TypeVar("T")

#: how often the mover looks again at pods that are not Ready yet
POLL_S = 0.2


@dataclass
class Mover:
    """One table's move: its thread, the progress the status shows, how to stop it."""

    to_shards: int
    closed: threading.Event = field(default_factory=threading.Event)
    progress: Resharding | None = None
    thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


@dataclass
class TableShards:
    """A table's shards as pods of its StatefulSet, seen from the mover's thread."""

    kube: Kube
    loop: asyncio.AbstractEventLoop
    owner: Owner
    spec: TableSpec
    port: int
    token: str | None
    tls: ClientTls | None
    timeout: float
    template: Callable[[int], dict[str, Any]]  # the pod template for this shard count
    confirm: Callable[[dict[str, Any]], None]  # the table exists on this pod
    publish: Callable[[], Coroutine[Any, Any, None]]  # mirror the status (the new map) now

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return call_on(self.loop, coro)

    @property
    def _sts(self) -> str:
        return path("StatefulSet", self.owner.namespace, render.workload_name(self.owner.name))

    def pods(self) -> dict[int, dict[str, Any]]:
        labels = render.selector_labels(self.owner)
        pods = self._call(self.kube.list(path("Pod", self.owner.namespace), labels=labels))
        return {pod_index(p): p for p in pods}

    def address(self, pod: dict[str, Any]) -> str:
        ip = pod["status"]["podIP"]
        return f"[{ip}]:{self.port}" if ":" in ip else f"{ip}:{self.port}"

    def endpoints(self) -> list[str]:
        pods = self.pods()
        return [self.address(pods[i]) for i in sorted(pods)]

    def replicas(self) -> int:
        sts = self._call(self.kube.get(self._sts)) or {}
        return int((sts.get("spec") or {}).get("replicas", 0))

    def scale(self, count: int) -> None:
        self._call(self.kube.patch(self._sts, {"spec": {"replicas": count}}))

    def grow_to(self, count: int) -> None:
        """Add pods sized for ``count`` shards (a node refuses an index beyond its count);
        the partition keeps the running pods on their template, so none restarts."""
        running = self.replicas()
        if running < count:
            strategy = {"type": "RollingUpdate", "rollingUpdate": {"partition": running}}
            spec = {"replicas": count, "updateStrategy": strategy, "template": self.template(count)}
            self._call(self.kube.patch(self._sts, {"spec": spec}))

    def shrink_to(self, count: int) -> None:
        if self.replicas() > count:
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


def start(mover: Mover, shards: TableShards, store: StatusJobStore, running: int) -> None:
    """Run the move in a thread of its own (``mover.thread``)."""

    def show(progress: Resharding) -> None:
        mover.progress = progress

    def run() -> None:
        try:
            if store.stored_map() is None:
                served = shards.served_map(running, mover.closed)
                if served is None:
                    return  # stopping before the shards served
                store.initialise(served)
            drive = Shards(
                name=shards.spec.name, endpoints=shards.endpoints, grow_to=shards.grow_to,
                serving=shards.serving, shrink_to=shards.shrink_to, report=shards.report,
                show=show, tls=shards.tls, closed=mover.closed, token=shards.token,
            )  # fmt: skip
            move(drive, store, mover.to_shards)
        except Exception as error:  # the API server gone: the next apply or resume retries
            log.exception("resharding %s stopped", shards.spec.name)
            if mover.progress is not None:
                p = mover.progress
                mover.progress = Resharding(
                    p.from_shards, p.to_shards, p.slots_moved, p.slots_total, p.bytes_moved,
                    p.epoch, running=False, error=str(error),
                )  # fmt: skip

    mover.thread = threading.Thread(target=run, name=f"reshard-{shards.spec.name}", daemon=True)
    mover.thread.start()


def pod_index(pod: Mapping[str, Any]) -> int:
    label = (pod["metadata"].get("labels") or {}).get(render.POD_INDEX_LABEL)
    return int(label) if label is not None else int(pod["metadata"]["name"].rsplit("-", 1)[1])
