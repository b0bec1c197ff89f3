"""The PS node processes of the local platform: how a shard's node is started and stopped.

Every shard of every table with nodes of its own, and every node of a pool, is one
``recstore ps-node`` process on loopback,
run by a `Supervisor` (which restarts a crashed one with the same port and
data directory). Its arguments come from the reconcile core, as the
operator's pod arguments do, plus what only the local platform adds: the
shard count the node sizes for while a move runs, and ``--parent-pid`` so the
node stops when `recstore up` exits. Before a node starts, whatever node an
earlier run left on that data directory is stopped (``recstore.local.leftovers``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from recstore.core.fleet import node_args
from recstore.core.placement import Placement
from recstore.core.reconcile import Declaration, ps_node_args
from recstore.core.tls import ServerTls
from recstore.local.leftovers import stop_leftover
from recstore.local.pool import LocalPool
from recstore.local.supervisor import ProcessSpec, Supervisor
from recstore.local.table import LocalTable, process_name

log = logging.getLogger(__name__)


class LocalNodes:
    """Starts, stops and watches the node processes of the provisioner's tables."""

    def __init__(
        self,
        *,
        placement: Placement,
        python: str,
        auth_token_file: Path | None,
        read_only_token_file: Path | None,
        tls: ServerTls | None,
    ) -> None:
        self._placement, self._python, self._tls = placement, python, tls
        self._auth_token_file = auth_token_file
        #: the read-only token of the nodes of inference tables (needs the auth token)
        self._read_only_token_file = read_only_token_file
        self._supervisor = Supervisor(on_restart=_on_restart)

    def start(self, table: LocalTable, shard: int) -> None:
        stop_leftover(table.shard_dir(shard))  # one node per data dir
        self._supervisor.start(self._process(table, shard))

    def stop(self, table: LocalTable, shard: int) -> None:
        self._supervisor.stop(table.process_name(shard))

    def stop_table(self, table: LocalTable) -> None:
        for shard in range(len(table.ports)):
            self.stop(table, shard)

    def start_pool(self, pool: LocalPool, shard: int) -> None:
        stop_leftover(pool.shard_dir(shard))
        grpc_port, metrics_port = pool.ports[shard]
        args = node_args(
            pool.spec.fleet,
            shard_index=shard,
            port=grpc_port,
            metrics_port=metrics_port,
            data_dir=str(pool.shard_dir(shard)),
            **self._shared_options(),
        )
        args[args.index("--num-shards") + 1] = str(pool.shards)
        self._supervisor.start(self._spec(pool.process_name(shard), args, pool.directory, shard))

    def stop_pool(self, pool: LocalPool) -> None:
        for shard in range(pool.shards):
            self.stop_pool_shard(pool, shard)

    def stop_pool_shard(self, pool: LocalPool, shard: int) -> None:
        self._supervisor.stop(pool.process_name(shard))

    def pool_pid(self, pool: LocalPool, shard: int) -> int:
        return self._supervisor.pid(pool.process_name(shard))

    def stop_all(self) -> None:
        self._supervisor.stop_all()

    def pid(self, table: str, shard: int) -> int:
        return self._supervisor.pid(process_name(table, shard))

    def restarts(self, table: str, shard: int) -> int:
        return self._supervisor.restarts(process_name(table, shard))

    def _process(self, table: LocalTable, shard: int) -> ProcessSpec:
        grpc_port, metrics_port = table.ports[shard]
        args = ps_node_args(
            Declaration(table.spec, self._placement),
            shard_index=shard,
            port=grpc_port,
            metrics_port=metrics_port,
            data_dir=str(table.shard_dir(shard)),
            **self._shared_options(),
        )
        args[args.index("--num-shards") + 1] = str(table.sizing_shards(shard))
        return self._spec(table.process_name(shard), args, table.directory, shard)

    def _shared_options(self) -> dict[str, Any]:
        """What every local node is started with: tokens, loopback, TLS."""
        return {
            "auth_token_file": str(self._auth_token_file) if self._auth_token_file else None,
            "read_only_token_file": (
                str(self._read_only_token_file) if self._read_only_token_file else None
            ),
            "host": "127.0.0.1",
            "tls": self._tls,
        }

    def _spec(self, name: str, args: list[str], directory: Path, shard: int) -> ProcessSpec:
        args = [*args, "--parent-pid", str(os.getpid())]  # the node stops when we exit
        return ProcessSpec(
            name=name,
            argv=[self._python, "-m", "recstore", *args],
            log_path=directory / f"shard-{shard}.log",
        )


def _on_restart(name: str, restarts: int) -> None:
    log.warning("restarted %s (restart %d)", name, restarts)
