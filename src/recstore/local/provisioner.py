"""The local provisioner: each table becomes PS node processes on this machine.

It is the single-machine twin of the Kubernetes operator and asks the same
reconcile core (`recstore.core.reconcile`) the same questions: which shards to
run with which arguments, and which phase and conditions follow from what is
running. Where the operator renders a StatefulSet, this starts one
``recstore ps-node`` process per shard on loopback under a `Supervisor`, which
restarts a crashed node with the same port and data directory (the node then
restores its shard by itself).

This module provisions: tables created, changed, checkpointed and deleted, and
their nodes started and stopped. Each table's state and on-disk layout are
``recstore.local.table``; the status reports ``recstore.local.table_status``;
an online move to a new shard count ``recstore.local.resharding``; pools, whose
nodes many tables share, ``recstore.local.pools``. A node
serving no table yet is given it with CreateTable, as the operator does; a
restarted node restores its tables from its data directory by itself.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recstore.admin.errors import ProvisioningError
from recstore.core.checkpoint_status import (
    CheckpointState,
    outcome,
    requested_checkpoint_id,
    running,
)
from recstore.core.placement import Placement
from recstore.core.pool import PoolSpec
from recstore.core.reshard.plan import DEFAULT_BATCH_SLOTS, Phase
from recstore.core.reshard.retry import RetryPolicy
from recstore.core.spec import TableSpec
from recstore.core.tls import LocalTls
from recstore.local import table_status
from recstore.local.nodes import LocalNodes
from recstore.local.pool import waiting_for
from recstore.local.pools import LocalPools
from recstore.local.reporting import Reporter
from recstore.local.resharding import (
    LOCAL_RESHARD_RETRY,
    LocalResharder,
    OwnNodes,
    job_store,
)
from recstore.local.shard_client import ShardClient
from recstore.local.table import LocalTable, load_or_pick_ports

log = logging.getLogger(__name__)


class LocalProvisioner:
    """Implements the admin API's Provisioner protocol with local processes."""

    def __init__(
        self,
        state_dir: Path,
        reporter: Reporter,
        *,
        device: str = "cpu",
        python: str = sys.executable,
        auth_token_file: Path | None = None,
        read_only_token_file: Path | None = None,
        poll_interval: float = 0.5,
        tls: LocalTls | None = None,
        online_resharding: bool = True,
        reshard_batch_slots: int = DEFAULT_BATCH_SLOTS,
        reshard_retry: RetryPolicy = LOCAL_RESHARD_RETRY,
        reshard_copy_rate: float = 0.0,
    ) -> None:
        self._root = Path(state_dir) / "tables"
        #: a new shard count moves slots online (else it is only flagged ReshardRequired)
        self._online = online_resharding
        self._reporter = reporter
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {device!r}")
        if read_only_token_file is not None and auth_token_file is None:
            raise ValueError("a read-only token file needs an auth token file (else anyone writes)")
        self._nodes = LocalNodes(
            placement=Placement(gpus=1 if device == "cuda" else 0), python=python,
            auth_token_file=auth_token_file, read_only_token_file=read_only_token_file,
            tls=tls.server if tls else None,
        )  # fmt: skip
        self._auth_token_file = auth_token_file
        self._tls = tls
        self._poll_interval = poll_interval
        self._tables: dict[str, LocalTable] = {}
        #: the clock of refusal back-offs (monotonic seconds)
        self.clock: Callable[[], float] = time.monotonic
        self._lock = threading.RLock()
        #: slots per batch of a move (one seal pauses this many), retried by ``reshard_retry``
        self._resharder = LocalResharder(
            own=OwnNodes(lock=self._lock, start_node=self._nodes.start,
                         stop_node=self._nodes.stop, client_of=self._shard_client),
            report=lambda table: table_status.report_committed(table, reporter, self.clock()),
            record=lambda name, event: reporter.record_reshard_event(name, event),
            tls=tls.client if tls else None, token=self._node_token,
            batch_slots=reshard_batch_slots,
            retry=reshard_retry,
            copy_rate=reshard_copy_rate,
        )  # fmt: skip
        self._pools = LocalPools(
            Path(state_dir) / "pools", nodes=self._nodes, tables=self._tables, lock=self._lock,
            client_of=self._shard_client, reporter=reporter, resharder=self._resharder,
        )  # fmt: skip
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="local-status", daemon=True)
        self._poller.start()

    # --- the Provisioner protocol -------------------------------------------------

    def create_table(self, spec: TableSpec, *, pool: str | None = None) -> None:
        """Start the table's nodes; a table on ``pool`` is placed on the pool's nodes instead
        (now if the pool is there and has room, else once it does)."""
        with self._lock:
            if spec.name in self._tables:
                raise ProvisioningError(f"table {spec.name!r} is already provisioned", 409)
            if pool is not None:
                self._tables[spec.name] = LocalTable(
                    spec=spec, directory=self._root / spec.name, ports=[], clients=[],
                    node_ids=[], pool=pool, placing=waiting_for(pool),
                )  # fmt: skip
                self._pools.place()
                return
            directory = self._root / spec.name
            directory.mkdir(parents=True, exist_ok=True)
            ports = load_or_pick_ports(directory / "ports.json", spec.shards)
            # a move interrupted by a stop resumes: every shard it involved starts again
            table = LocalTable(
                spec=spec,
                directory=directory,
                ports=ports,
                clients=[self._shard_client(f"127.0.0.1:{grpc}") for grpc, _ in ports],
                node_ids=[None] * spec.shards,
            )
            self._tables[spec.name] = table
            table.node_ids = [None] * len(ports)
            table.store = job_store(directory, None)
            for shard in range(len(ports)):
                self._nodes.start(table, shard)
            job = table.store.job() if table.store else None
            if (job is not None and job.phase != Phase.done) or len(ports) != spec.shards:
                self._start_reshard(table)
        # Registration and status go through the admin API from the poller: the
        # admin calls this inside its own transaction, which a nested call would wait on.

    def update_table(
        self, spec: TableSpec, *, previous: TableSpec, pool: str | None = None
    ) -> None:
        """A new shard count is declared (ReshardRequired follows); nothing else may change.

        Running nodes keep the spec their table was created with, so any other
        change is refused (409) rather than accepted and silently not applied.
        """
        changed = sorted(
            k for k, v in spec.to_wire().items() if previous.to_wire().get(k) != v and k != "shards"
        )
        if changed:
            raise ProvisioningError(
                f"changing {', '.join(changed)} of a running table is not supported; "
                "delete the table and create it again",
                status_code=409,
            )
        with self._lock:
            table = self._tables.get(spec.name)
            if table is None:
                raise ProvisioningError(f"table {spec.name!r} is not provisioned", 404)
            moving = self._resharder.moving(table)
            if moving and spec.shards != table.spec.shards and table.moving:
                raise ProvisioningError(
                    f"table {spec.name!r} is {table.moving.describe()}; change shards again "
                    "once this move is done",
                    status_code=409,
                )
            table.generation += 1
            if table.pool is not None:  # its shards are the pool's (the admin API checks)
                return
            table.spec = spec  # the declared count
            if spec.shards != len(table.ports) and not moving:
                self._start_reshard(table)

    def delete_table(self, name: str) -> None:
        """Stop the nodes (each writes a final checkpoint on SIGTERM), then remove the data."""
        with self._lock:
            table = self._tables.pop(name, None)
        if table is None:
            return
        if table.pool is not None:
            self._pools.drop(table)  # its pool's nodes, and their other tables, keep serving
            self._pools.place()  # its memory is free: a table that waited for room may fit
            return
        table.stopped.set()
        if table.resharder is not None:
            table.resharder.join(timeout=30)
        self._nodes.stop_table(table)
        for client in table.clients:
            client.close()
        shutil.rmtree(table.directory, ignore_errors=True)

    def request_checkpoint(self, name: str, checkpoint_id: int) -> None:
        """Every shard saves under one id, in a thread; the status reports how it went. A
        second request while one runs is refused (409)."""
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                raise ProvisioningError(f"table {name!r} is not provisioned", 404)
            if table.held:
                raise ProvisioningError(
                    f"table {name!r} is not placed on the nodes of pool {table.pool!r} yet: "
                    "nothing to checkpoint",
                    status_code=409,
                )
            asked = table.checkpoint_request
            if asked is not None and not asked.finished:
                raise ProvisioningError(
                    f"checkpoint {asked.request_id} of table {name!r} is still running; "
                    "request another once it has completed or failed",
                    status_code=409,
                )
            table.checkpoint_request = running(checkpoint_id)
        threading.Thread(
            target=self._checkpoint, args=(table, checkpoint_id), name="checkpoint", daemon=True
        ).start()

    def _checkpoint(self, table: LocalTable, request_id: int) -> None:
        checkpoint_id = requested_checkpoint_id(request_id)
        alone = [table.spec.name] if table.pool else []  # a pool's nodes hold other tables
        shards = [
            client.save(checkpoint_id, index=index, tables=alone)
            for index, client in enumerate(table.clients)
        ]
        result = outcome(
            checkpoint_id, shards, now=dt.datetime.now(dt.timezone.utc), request_id=request_id
        )
        if result.message:
            log.error("checkpoint %s of %s failed: %s", checkpoint_id, table.spec.name,
                      result.message)  # fmt: skip
        with self._lock:
            table.checkpoint_request = result
            if result.state == CheckpointState.completed:
                table.last_checkpoint = result

    def create_pool(self, name: str, spec: PoolSpec) -> None:
        self._pools.create(name, spec)

    def update_pool(self, name: str, spec: PoolSpec, *, previous: PoolSpec) -> None:
        self._pools.update(name, spec, previous=previous)

    def delete_pool(self, name: str) -> None:
        self._pools.delete(name)

    # --- queries ------------------------------------------------------------------

    def endpoints(self, name: str) -> list[str]:
        with self._lock:
            table = self._tables[name]
            return [table.endpoint(shard) for shard in range(len(table.ports))]

    def table_names(self) -> list[str]:
        with self._lock:
            return sorted(self._tables)

    def pool_names(self) -> list[str]:
        return self._pools.names()

    def pool_endpoints(self, name: str) -> list[str]:
        return self._pools.endpoints(name)

    def pool_node_pid(self, name: str, shard: int) -> int:
        return self._pools.pid(name, shard)

    def node_pid(self, name: str, shard: int) -> int:
        return self._nodes.pid(name, shard)

    def node_restarts(self, name: str, shard: int) -> int:
        return self._nodes.restarts(name, shard)

    def status(self, name: str) -> dict[str, Any]:
        """The table's status as last reported (wire form; empty before the first report)."""
        with self._lock:
            status = self._tables[name].status
            return status.to_wire() if status is not None else {}

    def close(self) -> None:
        """Stop every node (final checkpoints) and the status poller."""
        self._closed.set()
        self._poller.join(timeout=5)
        self._pools.stop_moves()  # no pool starts or stops a node from now on
        with self._lock:
            tables = list(self._tables.values())
        for table in tables:
            table.stopped.set()
            if table.resharder is not None:
                table.resharder.join(timeout=30)
        self._nodes.stop_all()
        with self._lock:
            for table in self._tables.values():
                for client in table.clients:
                    client.close()
            self._tables.clear()
        self._pools.close()

    # --- internals ----------------------------------------------------------------

    def _shard_client(self, endpoint: str) -> ShardClient:
        return ShardClient(
            endpoint, token=self._node_token(), tls=self._tls.client if self._tls else None
        )

    def _node_token(self) -> str | None:
        """The nodes' auth token (the provisioner creates and checkpoints tables with it)."""
        return self._auth_token_file.read_text().strip() if self._auth_token_file else None

    def report_now(self) -> None:
        """Observe every table and report what changed (the poller does this periodically)."""
        self._pools.place()
        with self._lock:
            tables = list(self._tables.values())
        for table in tables:
            table_status.report_polled(table, self._reporter, self.clock())
        self._pools.report()

    def _poll(self) -> None:
        while not self._closed.wait(self._poll_interval):
            self.report_now()

    def _start_reshard(self, table: LocalTable) -> None:
        if self._online:
            self._resharder.start(table)
