"""Online resharding on the local platform: a table's move to a new shard count.

A new ``shards`` in ``update_table`` (or one found on start) runs here, in a
thread of its own, ``recstore.core.reshard.drive`` (the protocol of
``recstore.core.reshard.protocol``): growing
starts the new nodes first (sized for the new count, owning no slot yet);
the batches move; shrinking stops the emptied highest shards last. The slot
map and the job live in the table's ``migration.json`` (``FileJobStore``), so
a restarted provisioner resumes: it finishes a committed batch, aborts any
other, and moves the rest. A try that fails (a node killed mid-move: the
supervisor restarts it) is tried again after the shared retry policy's wait
(``recstore.core.reshard.retry``). Progress goes to the status as the
``Resharding`` phase and condition; after each commit the new map is reported
to the admin API before the source starts refusing the moved slots, so a
refused client finds the new map when it refreshes. The move runs on the nodes it is
given (``MoveNodes``): a table's own (``OwnNodes``: started and stopped with it), or a
pool's (``recstore.local.pool_moves``: the pool grows and shrinks its nodes itself).
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from recstore.core.reconcile import Resharding
from recstore.core.reshard import pace as copy_pace
from recstore.core.reshard.drive import Shards, reshard
from recstore.core.reshard.events import ReshardEvent
from recstore.core.reshard.plan import Phase
from recstore.core.reshard.retry import RetryPolicy, Tries
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec
from recstore.core.tls import ClientTls
from recstore.local.ports import free_port
from recstore.local.reshard_store import FileJobStore
from recstore.local.shard_client import ShardClient, TableRefused
from recstore.local.table import LocalTable

log = logging.getLogger(__name__)

#: the local platform's retries of a failed move: 1 s doubling to a minute, never giving up
LOCAL_RESHARD_RETRY = RetryPolicy(first_s=1.0, cap_s=60.0)


def job_store(directory: Path, served: SlotMap | None) -> FileJobStore | None:
    """The table's store: the existing one, else a new one from the nodes' map (None: unknown)."""
    path = directory / "migration.json"
    if path.exists() or served is not None:
        return FileJobStore(path, served or SlotMap.initial(1))
    return None


class MoveNodes(Protocol):
    """The nodes a table's move runs on: how the table widens to, and narrows from, a count."""

    def grow_to(self, table: LocalTable, count: int) -> None:
        """The table has ``count`` nodes (its clients and ports), the new ones started."""

    def shrink_to(self, table: LocalTable, count: int) -> None:
        """The table keeps its first ``count`` nodes; the others own none of its slots."""


class OwnNodes:
    """A table's own node processes: grown by starting new ones on fresh ports, shrunk by
    stopping the emptied ones and removing their data."""

    def __init__(
        self,
        *,
        lock: threading.RLock,
        start_node: Callable[[LocalTable, int], None],
        stop_node: Callable[[LocalTable, int], None],
        client_of: Callable[[str], ShardClient],
    ) -> None:
        self._lock, self._start_node, self._stop_node = lock, start_node, stop_node
        self._client_of = client_of

    def grow_to(self, table: LocalTable, count: int) -> None:
        with self._lock:
            while len(table.ports) < count:
                table.ports.append((free_port(), free_port()))
                table.clients.append(self._client_of(table.endpoint(len(table.ports) - 1)))
                table.node_ids.append(None)
                table.save_ports()
                self._start_node(table, len(table.ports) - 1)

    def shrink_to(self, table: LocalTable, count: int) -> None:
        with self._lock:
            for shard in range(count, len(table.ports)):
                self._stop_node(table, shard)
                table.clients[shard].close()
            before = len(table.ports)
            del table.ports[count:], table.clients[count:], table.node_ids[count:]
            table.save_ports()
        for shard in range(count, before):
            shutil.rmtree(table.shard_dir(shard), ignore_errors=True)


class LocalResharder:
    """Runs tables' moves for the provisioner, which supplies the nodes a table's move runs
    on by default (its own), how the status is reported and where the move's moments go."""

    def __init__(
        self,
        *,
        own: MoveNodes,
        report: Callable[[LocalTable], None],
        record: Callable[[str, ReshardEvent], None],
        tls: ClientTls | None,
        token: Callable[[], str | None],
        batch_slots: int,
        retry: RetryPolicy = LOCAL_RESHARD_RETRY,
        copy_rate: float = 0.0,
    ) -> None:
        self._own = own
        self._report, self._record, self._tls = report, record, tls
        #: the nodes' auth token, read when a move starts (new shards and the runner use it)
        self._token = token
        self._batch_slots, self._retry = batch_slots, retry
        self._copy_rate = copy_pace.check_rate(copy_rate, "the reshard copy rate")

    @staticmethod
    def moving(table: LocalTable) -> bool:
        return table.resharder is not None and table.resharder.is_alive()

    def start(
        self,
        table: LocalTable,
        nodes: MoveNodes | None = None,
        changed: threading.Event | None = None,
    ) -> None:
        """Move ``table`` to ``table.spec.shards`` on ``nodes`` (None: its own), in a thread;
        ``changed`` is set at each step of it and when it ends (a try failed, or done)."""
        reported = table.status.slot_map_epoch if table.status else None
        epoch = table.store.slot_map().epoch if table.store else reported
        table.moving = Resharding(
            len(table.ports), table.spec.shards, 0, 0, 0, int(epoch or 1), running=True
        )  # until the job is planned
        table.resharder = threading.Thread(
            target=self._move, args=(table, nodes or self._own, changed or threading.Event()),
            name=f"reshard-{table.spec.name}", daemon=True,
        )  # fmt: skip
        table.resharder.start()

    def _move(self, table: LocalTable, nodes: MoveNodes, changed: threading.Event) -> None:
        try:
            self._tries(table, nodes, changed)
        finally:
            changed.set()

    def _tries(self, table: LocalTable, nodes: MoveNodes, changed: threading.Event) -> None:
        if table.store is None:
            served = self._served_map(table)
            if served is None:
                return  # stopped before the nodes served
            table.store = job_store(table.directory, served)
            assert table.store is not None
        # A try that failed is aborted or finished, and the move resumed from the stored
        # job, after the policy's wait.
        tries = Tries(self._retry)
        while True:
            job = reshard(self._shards_of(table, nodes, changed), table.store, table.spec.shards,
                          self._batch_slots, tries, self._copy_rate)  # fmt: skip
            if job is None or job.phase == Phase.done or table.stopped.is_set():
                return
            changed.set()  # a try failed: its error shows until the next one
            if tries.retry_in_s is None or table.stopped.wait(tries.retry_in_s):
                return
            tries.again()

    def _served_map(self, table: LocalTable) -> SlotMap | None:
        """The map every running node serves (they agree before a first move)."""
        while not table.stopped.wait(0.2):
            maps = [c.stats(table.spec.name) for c in list(table.clients)]
            if all(m is not None for m in maps):
                found = {m.slot_map for m in maps if m is not None}
                if len(found) == 1 and None not in found:
                    return found.pop()
        return None

    def _shards_of(self, table: LocalTable, nodes: MoveNodes, changed: threading.Event) -> Shards:
        token = self._token()

        def serving(shard: int, slot_map: SlotMap) -> bool:
            try:
                return shard_serves(table.clients[shard], table.spec, slot_map)
            except TableRefused as error:
                raise RuntimeError(f"shard {shard} refused the table: {error.reason}") from error

        def show(progress: Resharding) -> None:
            table.moving = progress
            changed.set()

        return Shards(
            name=table.spec.name,
            endpoints=lambda: [table.endpoint(s) for s in range(len(table.ports))],
            grow_to=lambda count: nodes.grow_to(table, count), serving=serving,
            shrink_to=lambda count: nodes.shrink_to(table, count),
            report=lambda: self._report(table), show=show, tls=self._tls, token=token,
            closed=table.stopped,
            record=lambda event: self._record(table.spec.name, event),
        )  # fmt: skip


def shard_serves(client: ShardClient, spec: TableSpec, slot_map: SlotMap) -> bool:
    """Whether a shard hosts the table, created on a node that lacks it (False: not serving
    yet). A restarted node restores its tables by itself and can answer before it has: a
    create then meets the restored table, whose spec may still carry the shard count from
    before the move. That is the table asked for, so the shard serves it; a refusal with no
    table there is final (``TableRefused``)."""
    if client.stats(spec.name) is not None:
        return True
    try:
        return client.ensure_table(spec, slot_map)
    except TableRefused:
        if client.stats(spec.name) is not None:
            return True
        raise
