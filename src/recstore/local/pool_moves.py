"""Resharding a pool on `recstore up`: every table on it moves, one online move each.

A new ``shards`` of a pool (PATCH, `recstore apply -f`) runs here, in a thread of the
pool's. ``recstore.core.pool_reshard`` decides each step from the tables' stored slot maps
and jobs, as it does for the operator; this applies it: new nodes start first (holding no
table: a table's move creates it there with its moving map, owning no slot), each table
moves with the table's own move machinery (``recstore.local.resharding``) pointed at the
pool's nodes (``PoolNodes``), and the nodes that go stop only once no table's map names
them. A table whose move fails is rolled back by the protocol and retried, alone; the
pool keeps the nodes it still uses. A shrink whose tables would not fit the fewer nodes
is refused (``refusal``) before anything moves.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Sequence

from recstore.core.pool import PoolSpec
from recstore.core.pool_reshard import PoolMoveState, TableSpan, pool_step, shrink_refusal
from recstore.core.pool_reshard import table_span as stored_span
from recstore.local.nodes import LocalNodes
from recstore.local.pool import LocalPool
from recstore.local.ports import free_port
from recstore.local.resharding import LocalResharder
from recstore.local.shard_client import ShardClient
from recstore.local.table import LocalTable

log = logging.getLogger(__name__)

#: how often a pool's move looks again without news from its tables (a table placed on it)
RECHECK_S = 1.0


class PoolNodes:
    """A table's move over its pool's nodes: the pool starts and stops them; the table
    only takes, or gives up, its clients of them."""

    def __init__(
        self, pool: LocalPool, lock: threading.RLock, client_of: Callable[[str], ShardClient]
    ) -> None:
        self._pool, self._lock, self._client_of = pool, lock, client_of

    def grow_to(self, table: LocalTable, count: int) -> None:
        with self._lock:
            if self._pool.shards < count:
                raise RuntimeError(
                    f"pool {self._pool.name!r} runs {self._pool.shards} nodes; the move of "
                    f"{table.spec.name!r} needs {count}"
                )
            while len(table.ports) < count:
                shard = len(table.ports)
                table.ports.append(self._pool.ports[shard])
                table.clients.append(self._client_of(self._pool.endpoint(shard)))
                table.node_ids.append(None)

    def shrink_to(self, table: LocalTable, count: int) -> None:
        with self._lock:
            for client in table.clients[count:]:
                client.close()
            del table.ports[count:], table.clients[count:], table.node_ids[count:]


def table_span(table: LocalTable) -> TableSpan:
    """How many of the pool's nodes a placed table uses, and whether its move is done."""
    if table.store is None:  # never moved: its initial map over the nodes it was placed on
        return TableSpan(len(table.ports), settled=True)
    job = table.store.job()
    return stored_span(table.store.slot_map().to_dict(), job.to_dict() if job else None)


class PoolMoves:
    """Moves the pools of one local provisioner; ``lock`` and ``tables`` are its own."""

    def __init__(
        self,
        *,
        lock: threading.RLock,
        nodes: LocalNodes,
        tables: dict[str, LocalTable],
        resharder: LocalResharder,
        client_of: Callable[[str], ShardClient],
    ) -> None:
        self._lock, self._nodes, self._tables = lock, nodes, tables
        self._resharder, self._client_of = resharder, client_of

    @staticmethod
    def running(pool: LocalPool) -> bool:
        return pool.mover is not None and pool.mover.is_alive()

    def refusal(self, pool: LocalPool, spec: PoolSpec) -> str | None:
        """Why the pool's tables would not fit ``spec.shards`` nodes (None: they do)."""
        placed = self._placed(pool)
        running = max([pool.shards] + [table_span(t).shards for t in placed])
        moved = [
            (t.spec.name, t.spec.model_copy(update={"shards": spec.shards,
                                                    "checkpoint": spec.checkpoint}))
            for t in placed
        ]  # fmt: skip
        return shrink_refusal(pool.name, spec, moved, running, spec.shards)

    def start(self, pool: LocalPool) -> None:
        """Move the pool to ``pool.spec.shards`` nodes, in a thread of its own."""
        pool.mover = threading.Thread(
            target=self._drive, args=(pool,), name=f"pool-reshard-{pool.name}", daemon=True
        )
        pool.mover.start()

    def stop(self, pool: LocalPool) -> None:
        pool.stopped.set()
        pool.changed.set()
        if pool.mover is not None:
            pool.mover.join(timeout=30)

    def _drive(self, pool: LocalPool) -> None:
        try:
            while not pool.stopped.is_set():
                pool.changed.clear()
                with self._lock:
                    if not self._step(pool):
                        return
                pool.changed.wait(RECHECK_S)
        except Exception:  # shown in the log; the pool's status keeps its last progress
            log.exception("resharding pool %s stopped", pool.name)

    def _step(self, pool: LocalPool) -> bool:
        """Take the next step (under the lock); False once nothing moves any more."""
        target, placed = pool.spec.shards, self._placed(pool)
        spans = {t.spec.name: table_span(t) for t in placed}
        busy = {t.spec.name for t in placed if self._resharder.moving(t)}
        errors = {
            t.spec.name: t.moving.error
            for t in placed
            if t.moving is not None and t.moving.error and t.moving.to_shards == target
        }
        previous = pool.moves.progress if pool.moves is not None else None
        step = pool_step(
            target=target, replicas=pool.shards, tables=spans, busy=busy, failed=set(errors),
            previous=previous,
        )  # fmt: skip
        if step.scale_to is not None:
            self._scale(pool, step.scale_to)
        for table in placed:
            if table.spec.name in step.move:
                self._move(pool, table)
        moving = bool(busy or step.move or step.scale_to is not None)
        pool.moves = PoolMoveState(step.progress, moving=moving, errors=errors)
        return moving

    def _move(self, pool: LocalPool, table: LocalTable) -> None:
        table.spec = table.spec.model_copy(update={"shards": pool.spec.shards})
        table.directory.mkdir(parents=True, exist_ok=True)  # its slot map and job
        nodes = PoolNodes(pool, self._lock, self._client_of)
        self._resharder.start(table, nodes, pool.changed)

    def _scale(self, pool: LocalPool, count: int) -> None:
        log.info("pool %r: %d -> %d nodes", pool.name, pool.shards, count)
        while pool.shards < count:  # a new node holds no table until a move creates it there
            pool.ports.append((free_port(), free_port()))
            pool.clients.append(self._client_of(pool.endpoint(pool.shards - 1)))
            pool.save_ports()
            self._nodes.start_pool(pool, pool.shards - 1)
        gone = range(count, pool.shards)
        for shard in gone:  # no table's map names these nodes any more
            self._nodes.stop_pool_shard(pool, shard)
            pool.clients[shard].close()
        del pool.ports[count:], pool.clients[count:]
        pool.save_ports()
        for shard in gone:
            shutil.rmtree(pool.shard_dir(shard), ignore_errors=True)

    def _placed(self, pool: LocalPool) -> Sequence[LocalTable]:
        """The tables the pool's nodes hold, in the order they were declared."""
        return [t for t in self._tables.values() if t.pool == pool.name and t.ports]
