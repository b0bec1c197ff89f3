"""The local provisioner's pools: their node processes, the tables placed on them, their status.

A pool's nodes start when it is created and serve every table placed on it; a table on a
pool starts no process of its own. The poller places the tables that wait (their pool did
not exist, or did not have room) as soon as they can be, with the shared capacity rule,
and reports each pool's status (``recstore.core.pool_status``) to the admin API. Deleting
a table drops it from the pool's nodes, leaving the others serving; a pool that still
holds tables is not deleted. A new ``shards`` moves every table on it online
(``recstore.local.pool_moves``); one its tables would not fit is refused (409).
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import httpx

from recstore.admin.errors import ProvisioningError
from recstore.core.checkpoint_status import final_checkpoint_id
from recstore.core.pool import PoolSpec
from recstore.core.pool_status import TableOnPool, pool_status
from recstore.core.reconcile import Observation, PoolPlacing, ShardState
from recstore.local.nodes import LocalNodes
from recstore.local.pool import LocalPool, waiting_for
from recstore.local.pool_moves import PoolMoves, table_span
from recstore.local.reporting import Reporter
from recstore.local.resharding import LocalResharder, job_store
from recstore.local.shard_client import ShardClient
from recstore.local.table import LocalTable, load_or_pick_ports

log = logging.getLogger(__name__)


class LocalPools:
    """The pools of one local provisioner; ``tables`` and ``lock`` are the provisioner's."""

    def __init__(
        self,
        root: Path,
        *,
        nodes: LocalNodes,
        tables: dict[str, LocalTable],
        lock: threading.RLock,
        client_of: Callable[[str], ShardClient],
        reporter: Reporter,
        resharder: LocalResharder,
    ) -> None:
        self._root, self._nodes, self._tables, self._lock = root, nodes, tables, lock
        self._client_of, self._reporter = client_of, reporter
        self._pools: dict[str, LocalPool] = {}
        self._moves = PoolMoves(
            lock=lock, nodes=nodes, tables=tables, resharder=resharder, client_of=client_of
        )

    def create(self, name: str, spec: PoolSpec) -> None:
        with self._lock:
            if name in self._pools:
                raise ProvisioningError(f"pool {name!r} is already provisioned", 409)
            directory = self._root / name
            directory.mkdir(parents=True, exist_ok=True)
            ports = load_or_pick_ports(directory / "ports.json", spec.shards)
            pool = LocalPool(
                name=name, spec=spec, directory=directory, ports=ports,
                clients=[self._client_of(f"127.0.0.1:{grpc}") for grpc, _ in ports],
            )  # fmt: skip
            self._pools[name] = pool
            for shard in range(pool.shards):
                self._nodes.start_pool(pool, shard)
            self.place()

    def update(self, name: str, spec: PoolSpec, *, previous: PoolSpec) -> None:
        """A new memory request or placement is taken (capacity is checked against it), a new
        ``shards`` moves every table on the pool; what the running nodes were started with,
        a shrink its tables would not fit, or a new count while one is moving, is refused
        (409), nothing changed."""
        with self._lock:
            pool = self._pools.get(name)
            if pool is None:
                raise ProvisioningError(f"pool {name!r} is not provisioned", 404)
            resharding = spec.shards != pool.spec.shards
            if resharding and self._moves.running(pool):
                progress = pool.moves.progress if pool.moves is not None else None
                where = f" {progress.from_shards} -> {progress.to_shards}" if progress else ""
                raise ProvisioningError(
                    f"pool {name!r} is resharding{where}; change its shards again once this "
                    "move is done",
                    status_code=409,
                )
            refused = self._moves.refusal(pool, spec) if resharding else None
            if refused is not None:
                raise ProvisioningError(refused, status_code=409)
            started = [
                field
                for field in ("checkpoint", "read_only_tokens", "gpu_memory")
                if getattr(spec, field) != getattr(previous, field)
            ] + (["placement.gpus"] if spec.placement.gpus != previous.placement.gpus else [])
            if started:
                raise ProvisioningError(
                    f"changing {', '.join(started)} of pool {name!r} is not supported: its "
                    "nodes were started with them; delete its tables and the pool and create "
                    "them again",
                    status_code=409,
                )  # fmt: skip
            pool.spec = spec
            pool.generation += 1
            self.place()
            if resharding:
                self._moves.start(pool)

    def delete(self, name: str) -> None:
        """Stop the pool's nodes and remove their data; refused (409) while it holds tables."""
        with self._lock:
            holding = sorted(t.spec.name for t in self._tables.values() if t.pool == name)
            if holding:
                raise ProvisioningError(
                    f"pool {name!r} still holds tables {', '.join(holding)}: delete them first",
                    status_code=409,
                )
            pool = self._pools.pop(name, None)
        if pool is None:
            return
        self._moves.stop(pool)
        self._nodes.stop_pool(pool)
        for client in pool.clients:
            client.close()
        shutil.rmtree(pool.directory, ignore_errors=True)

    def drop(self, table: LocalTable) -> None:
        """Drop a deleted table from its pool's nodes (their other tables keep serving),
        after a last checkpoint of it alone, as a table's own nodes write when stopped."""
        table.stopped.set()  # a move of it (its pool's change of shards) stops first
        if table.resharder is not None:
            table.resharder.join(timeout=30)
        final = final_checkpoint_id(dt.datetime.now(dt.timezone.utc))
        for index, client in enumerate(table.clients):
            saved = client.save(final, index=index, tables=[table.spec.name])
            if not saved.ok:
                log.warning("table %r: no final checkpoint on %s: %s", table.spec.name,
                            client.endpoint, saved.error)  # fmt: skip
        for client in table.clients:
            if not client.drop_table(table.spec.name):
                log.warning("table %r not dropped from %s (not reachable): its node drops it "
                            "when asked again", table.spec.name, client.endpoint)  # fmt: skip
            client.close()
        shutil.rmtree(table.directory, ignore_errors=True)  # its slot map, once it moved

    def place(self) -> None:
        """Place every table that waits on its pool where it fits now (under the lock)."""
        with self._lock:
            for name, tables in self._by_pool().items():
                pool = self._pools.get(name)
                if pool is None:
                    for table in tables:
                        if table.held:
                            table.placing = waiting_for(name)
                    continue
                for table in tables:
                    if table.held:
                        table.unfit = pool.refusal(table.spec)
                admission = pool.admission(tables)
                for table in tables:
                    if table.unfit is not None:
                        table.placing = PoolPlacing(name)
                    elif table.held and table.spec.name in admission.refused:
                        refused = admission.refused[table.spec.name]
                        table.placing = PoolPlacing(name, capacity=refused)
                    elif table.held:
                        self._attach(table, pool)
                    else:
                        table.placing = PoolPlacing(name)

    def _attach(self, table: LocalTable, pool: LocalPool) -> None:
        """Give the table the pool's nodes: all of them, or those its stored slot map (a
        table moved before a restart) names."""
        table.store = table.store or job_store(table.directory, None)
        shards = min(table_span(table).shards, pool.shards) if table.store else pool.shards
        table.spec = pool.held_spec(table.spec).model_copy(update={"shards": shards})
        table.ports = list(pool.ports[:shards])
        table.clients = [self._client_of(pool.endpoint(i)) for i in range(shards)]
        table.node_ids = [None] * shards
        table.placing = PoolPlacing(pool.name)

    def _by_pool(self) -> dict[str, list[LocalTable]]:
        grouped: dict[str, list[LocalTable]] = {}
        for table in self._tables.values():
            if table.pool is not None:
                grouped.setdefault(table.pool, []).append(table)
        return grouped

    def report(self) -> None:
        """Observe every pool's nodes and report its status when it changed."""
        with self._lock:
            pools = list(self._pools.values())
            grouped = self._by_pool()
        for pool in pools:
            try:
                self._report(pool, grouped.get(pool.name, []))
            except httpx.HTTPError as error:  # next round reports (e.g. not committed yet)
                log.debug("status report for pool %s: %s", pool.name, error)
            except Exception:  # a bug must show, but must not stop the provisioner
                log.exception("status report for pool %s failed", pool.name)

    def _report(self, pool: LocalPool, tables: list[LocalTable]) -> None:
        shards = tuple(
            ShardState(i, pool.endpoint(i), ready=client.serving())
            for i, client in enumerate(pool.clients)
        )
        on_pool = [
            TableOnPool(
                name=t.spec.name,
                phase=str(t.status.phase) if t.status is not None else None,
                shards=None if t.held else len(t.ports),
            )
            for t in tables
        ]
        status = pool_status(
            problem=None, spec=pool.spec,
            observation=Observation(running_shards=pool.shards, shards=shards),
            admission=pool.admission(tables), tables=on_pool, generation=pool.generation,
            previous=pool.status.to_wire() if pool.status is not None else None,
            now=dt.datetime.now(dt.timezone.utc), moves=pool.moves,
        )  # fmt: skip
        if status != pool.status:
            self._reporter.report_pool_status(pool.name, status.to_wire())
            pool.status = status

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._pools)

    def endpoints(self, name: str) -> list[str]:
        with self._lock:
            pool = self._pools[name]
            return [pool.endpoint(i) for i in range(pool.shards)]

    def pid(self, name: str, shard: int) -> int:
        with self._lock:
            pool = self._pools[name]
        return self._nodes.pool_pid(pool, shard)

    def stop_moves(self) -> None:
        """Stop every pool's move (its tables' moves stop with them; a restart resumes)."""
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            self._moves.stop(pool)

    def close(self) -> None:
        """Close the clients (the provisioner stops every node process)."""
        self.stop_moves()
        with self._lock:
            for pool in self._pools.values():
                for client in pool.clients:
                    client.close()
            self._pools.clear()
