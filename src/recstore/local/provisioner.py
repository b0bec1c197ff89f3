"""The local provisioner: each table becomes PS node processes on this machine.

It is the single-machine twin of the Kubernetes operator and asks the same
reconcile core (`recstore.core.reconcile`) the same questions: which shards to
run with which arguments, and which phase and conditions follow from what is
running. Where the operator renders a StatefulSet, this starts one
``recstore ps-node`` process per shard on loopback under a `Supervisor`, which
restarts a crashed node with the same port and data directory (the node then
restores its shard by itself).

State lives under ``state_dir/tables/<name>/``: the shard ports (stable across
restarts of `recstore up`) and one data directory per shard. A node serving no
table yet is given it with CreateTable, as the operator does; a restarted node
restores its tables from its data directory by itself.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from recstore.admin.errors import ProvisioningError
from recstore.core.migration import DEFAULT_BATCH_SLOTS, Phase
from recstore.core.placement import Placement
from recstore.core.reconcile import (
    Declaration,
    Observation,
    Resharding,
    ShardState,
    admin_status,
    compute_status,
    ps_node_args,
)
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec
from recstore.core.tls import LocalTls
from recstore.local import resharding
from recstore.local.leftovers import stop_leftover
from recstore.local.migration_store import FileJobStore
from recstore.local.reporting import Reporter
from recstore.local.shard_client import ShardClient, TableRefused
from recstore.local.supervisor import ProcessSpec, Supervisor

log = logging.getLogger(__name__)


@dataclass
class RetryBackoff:
    """When to ask a node again after a refusal: 1 s, doubling to at most ``cap`` seconds."""

    first: float = 1.0
    cap: float = 60.0
    delay: float = field(init=False)
    next_at: float = 0.0

    def __post_init__(self) -> None:
        self.delay = self.first

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def failed(self, now: float) -> None:
        self.next_at = now + self.delay
        self.delay = min(self.cap, self.delay * 2)

    def succeeded(self) -> None:
        self.delay, self.next_at = self.first, 0.0


@dataclass
class _Table:
    spec: TableSpec
    directory: Path
    ports: list[tuple[int, int]]  # (grpc, metrics) per shard
    clients: list[ShardClient]
    node_ids: list[int | None]
    status: dict[str, Any] = field(default_factory=dict)
    generation: int = 1
    last_checkpoint: dict[str, Any] | None = None
    refused: str | None = None  # why a node does not host the table (shown in the status)
    refused_reason: str | None = None  # the node's own words, to say a refusal once
    retry: RetryBackoff = field(default_factory=RetryBackoff)
    #: one CreateTable attempt at a time (the poller and ``report_now`` both ask)
    ensuring: threading.Lock = field(default_factory=threading.Lock)
    #: one status report at a time (the poller and a move's commits both report)
    reporting: threading.Lock = field(default_factory=threading.Lock)
    #: the slot map and migration job, once the table was (or is being) resharded online
    store: FileJobStore | None = None
    moving: Resharding | None = None
    mover: threading.Thread | None = None
    stopped: threading.Event = field(default_factory=threading.Event)

    def endpoint(self, shard: int) -> str:
        return f"127.0.0.1:{self.ports[shard][0]}"


def _shard_dir(table: _Table, shard: int) -> Path:
    return table.directory / f"shard-{shard}"


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
    ) -> None:
        self._root = Path(state_dir) / "tables"
        #: a new shard count moves slots online (else it is only flagged ReshardRequired)
        self._online = online_resharding
        #: slots per batch of a move (one seal pauses this many)
        self._batch_slots = reshard_batch_slots
        self._reporter = reporter
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {device!r}")
        if read_only_token_file is not None and auth_token_file is None:
            raise ValueError("a read-only token file needs an auth token file (else anyone writes)")
        self._placement = Placement(gpus=1 if device == "cuda" else 0)
        self._python = python
        self._auth_token_file = auth_token_file
        #: the read-only token of the nodes of inference tables (needs the auth token)
        self._read_only_token_file = read_only_token_file
        self._tls = tls
        self._poll_interval = poll_interval
        self._tables: dict[str, _Table] = {}
        #: the clock of refusal back-offs (monotonic seconds)
        self.clock: Callable[[], float] = time.monotonic
        self._lock = threading.RLock()
        self._supervisor = Supervisor(on_restart=self._on_restart)
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="local-status", daemon=True)
        self._poller.start()

    # --- the Provisioner protocol -------------------------------------------------

    def create_table(self, spec: TableSpec) -> None:
        with self._lock:
            if spec.name in self._tables:
                raise ProvisioningError(f"table {spec.name!r} is already provisioned", 409)
            directory = self._root / spec.name
            directory.mkdir(parents=True, exist_ok=True)
            ports = _load_or_pick_ports(directory / "ports.json", spec.shards)
            # a move interrupted by a stop resumes: every shard it involved starts again
            table = _Table(
                spec=spec,
                directory=directory,
                ports=ports,
                clients=[
                    ShardClient(
                        f"127.0.0.1:{grpc}",
                        token=self._node_token(),
                        tls=self._tls.client if self._tls else None,
                    )
                    for grpc, _ in ports
                ],
                node_ids=[None] * spec.shards,
            )
            self._tables[spec.name] = table
            table.node_ids = [None] * len(ports)
            table.store = resharding.job_store(directory, None)
            for shard in range(len(ports)):
                stop_leftover(_shard_dir(table, shard))  # one node per data dir
                self._supervisor.start(self._process(table, shard))
            job = table.store.job() if table.store else None
            if (job is not None and job.phase != Phase.done) or len(ports) != spec.shards:
                self._start_move(table)
        # Registration and status go through the admin API from the poller: the
        # admin calls this inside its own transaction, which a nested call would wait on.

    def update_table(self, spec: TableSpec, *, previous: TableSpec) -> None:
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
            if self._moving(table) and spec.shards != table.spec.shards and table.moving:
                raise ProvisioningError(
                    f"table {spec.name!r} is {table.moving.describe()}; change shards again "
                    "once this move is done",
                    status_code=409,
                )
            table.generation += 1
            table.spec = spec  # the declared count
            if spec.shards != len(table.ports) and not self._moving(table):
                self._start_move(table)

    def delete_table(self, name: str) -> None:
        """Stop the nodes (each writes a final checkpoint on SIGTERM), then remove the data."""
        with self._lock:
            table = self._tables.pop(name, None)
        if table is None:
            return
        table.stopped.set()
        if table.mover is not None:
            table.mover.join(timeout=30)
        self._stop_nodes(table)
        for client in table.clients:
            client.close()
        shutil.rmtree(table.directory, ignore_errors=True)

    def request_checkpoint(self, name: str, checkpoint_id: int) -> None:
        with self._lock:
            table = self._tables.get(name)
        if table is None:
            raise ProvisioningError(f"table {name!r} is not provisioned", 404)
        threading.Thread(
            target=self._checkpoint, args=(table, checkpoint_id), name="checkpoint", daemon=True
        ).start()

    def _checkpoint(self, table: _Table, checkpoint_id: int) -> None:
        try:
            saved = [client.save(f"request-{checkpoint_id}") for client in table.clients]
        except RuntimeError:
            log.exception("checkpoint %d of %s failed", checkpoint_id, table.spec.name)
            return
        table.last_checkpoint = {
            "id": checkpoint_id,
            "checkpoints": saved,
            "at": dt.datetime.now(dt.timezone.utc).isoformat(),
        }

    # --- queries ------------------------------------------------------------------

    def endpoints(self, name: str) -> list[str]:
        with self._lock:
            table = self._tables[name]
            return [table.endpoint(shard) for shard in range(len(table.ports))]

    def table_names(self) -> list[str]:
        with self._lock:
            return sorted(self._tables)

    def node_pid(self, name: str, shard: int) -> int:
        return self._supervisor.pid(_process_name(name, shard))

    def node_restarts(self, name: str, shard: int) -> int:
        return self._supervisor.restarts(_process_name(name, shard))

    def status(self, name: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._tables[name].status)

    def close(self) -> None:
        """Stop every node (final checkpoints) and the status poller."""
        self._closed.set()
        self._poller.join(timeout=5)
        with self._lock:
            tables = list(self._tables.values())
        for table in tables:
            table.stopped.set()
            if table.mover is not None:
                table.mover.join(timeout=30)
        self._supervisor.stop_all()
        with self._lock:
            for table in self._tables.values():
                for client in table.clients:
                    client.close()
            self._tables.clear()

    # --- internals ----------------------------------------------------------------

    def _node_token(self) -> str | None:
        """The nodes' auth token (the provisioner creates and checkpoints tables with it)."""
        return self._auth_token_file.read_text().strip() if self._auth_token_file else None

    def _process(self, table: _Table, shard: int) -> ProcessSpec:
        grpc_port, metrics_port = table.ports[shard]
        args = ps_node_args(
            Declaration(table.spec, self._placement),
            shard_index=shard,
            port=grpc_port,
            metrics_port=metrics_port,
            data_dir=str(_shard_dir(table, shard)),
            auth_token_file=str(self._auth_token_file) if self._auth_token_file else None,
            read_only_token_file=(
                str(self._read_only_token_file) if self._read_only_token_file else None
            ),
            host="127.0.0.1",
            tls=self._tls.server if self._tls else None,
        )
        args[args.index("--num-shards") + 1] = str(_sizing_shards(table, shard))
        args += ["--parent-pid", str(os.getpid())]  # the node stops when this process exits
        return ProcessSpec(
            name=_process_name(table.spec.name, shard),
            argv=[self._python, "-m", "recstore", *args],
            log_path=table.directory / f"shard-{shard}.log",
        )

    def _stop_nodes(self, table: _Table) -> None:
        for shard in range(len(table.ports)):
            self._supervisor.stop(_process_name(table.spec.name, shard))

    def _on_restart(self, process_name: str, restarts: int) -> None:
        log.warning("restarted %s (restart %d)", process_name, restarts)

    def report_now(self) -> None:
        """Observe every table and report what changed (the poller does this periodically)."""
        with self._lock:
            tables = list(self._tables.values())
        for table in tables:
            try:
                self._report(table)
            except httpx.HTTPStatusError as error:
                if error.response.status_code == 404:
                    # the admin API has not committed this table yet: next round
                    log.debug(
                        "status report for %s: table not in the catalogue yet", table.spec.name
                    )
                else:
                    log.warning("status report for %s refused: %s", table.spec.name, error)
            except httpx.TransportError as error:
                log.warning("status report for %s failed: %s", table.spec.name, error)
            except Exception:  # a bug must show, but must not stop the provisioner
                log.exception("status report for %s failed", table.spec.name)

    def _poll(self) -> None:
        while not self._closed.wait(self._poll_interval):
            self.report_now()

    def _ensure(self, table: _Table, shard: int, client: ShardClient) -> bool:
        """CreateTable on a node without the table, unless a refusal's backoff is running."""
        with table.ensuring:
            return self._ensure_locked(table, shard, client)

    def _ensure_locked(self, table: _Table, shard: int, client: ShardClient) -> bool:
        now = self.clock()
        if not table.retry.due(now):
            return False
        try:
            # a table moved online: a node without it (a new shard) joins the moving map
            created = client.ensure_table(
                table.spec, table.store.slot_map() if table.store is not None else None
            )
        except TableRefused as error:
            if error.reason != table.refused_reason:  # said once, not at every poll or shard
                table.refused_reason = error.reason
                table.refused = f"shard {shard} ({error.endpoint}) refused it: {error.reason}"
                log.error("table %r: %s (asking again after a back-off)", table.spec.name,
                          table.refused)  # fmt: skip
            table.retry.failed(now)
            return False
        if created:
            table.refused = table.refused_reason = None
            table.retry.succeeded()
        return created

    def _report(self, table: _Table) -> None:
        with table.reporting:
            self._report_locked(table)

    def _report_locked(self, table: _Table) -> None:
        shards, served_maps = [], set()
        for shard, client in enumerate(table.clients):
            stats = client.stats(table.spec.name)
            if stats is None and self._ensure(table, shard, client):
                stats = client.stats(table.spec.name)
            shards.append(ShardState(shard, table.endpoint(shard), ready=stats is not None))
            node_id = table.node_ids[shard]
            if node_id is None:
                node_id = table.node_ids[shard] = self._reporter.register_node(
                    table.spec.name,
                    shard,
                    table.endpoint(shard),
                    f"127.0.0.1:{table.ports[shard][1]}",
                )
            if stats is not None:
                served_maps.add(stats.slot_map)
            if node_id is not None:
                rows, memory = (stats.rows, stats.memory_bytes) if stats is not None else (0, 0)
                self._reporter.heartbeat(node_id, stats is not None, rows, memory)
        status = compute_status(
            problem=None,
            declared_shards=table.spec.shards,
            observation=Observation(
                running_shards=len(table.ports),
                shards=tuple(shards),
                refused=table.refused,
                resharding=table.moving,
            ),
            generation=table.generation,
            previous=table.status,
            now=dt.datetime.now(dt.timezone.utc),
        )
        status["lastCheckpoint"] = table.last_checkpoint
        served = served_maps.pop() if len(served_maps) == 1 else None
        if table.store is not None:  # moved online: the committed map is the truth
            committed = table.store.slot_map()
            status["slotMap"], status["slotMapEpoch"] = committed.to_dict(), committed.epoch
            # a shard being emptied for removal, which the map no longer names, is not shown
            shown = max(committed.num_shards, table.spec.shards)
            status["shards"] = [s for s in status["shards"] if s["index"] < shown]
        elif served is not None and all(s.ready for s in shards):
            # the nodes' map is the truth: after an offline reshard it is not the catalogue's
            status["slotMap"] = served.to_dict()
        if status != table.status:
            body = admin_status(status)
            if "slotMap" in status:
                body["slotMap"] = status["slotMap"]
            self._reporter.report_status(table.spec.name, body)
            table.status = status

    # --- online resharding (recstore.local.resharding) ------------------------------

    @staticmethod
    def _moving(table: _Table) -> bool:
        return table.mover is not None and table.mover.is_alive()

    def _start_move(self, table: _Table) -> None:
        if not self._online:
            return
        epoch = table.store.slot_map().epoch if table.store else table.status.get("slotMapEpoch")
        table.moving = Resharding(
            len(table.ports), table.spec.shards, 0, 0, 0, int(epoch or 1), running=True
        )  # until the job is planned
        table.mover = threading.Thread(
            target=self._move, args=(table,), name=f"reshard-{table.spec.name}", daemon=True
        )
        table.mover.start()

    def _move(self, table: _Table) -> None:
        if table.store is None:
            served = self._served_map(table)
            if served is None:
                return  # stopped before the nodes served
            table.store = resharding.job_store(table.directory, served)
            assert table.store is not None
        # A batch that failed (a node killed mid-move: the supervisor restarts it) is
        # aborted or finished, and the move resumed from the stored job, after a back-off.
        retry, failed_at = RetryBackoff(), -1
        while True:
            job = resharding.move(
                self._shards_of(table), table.store, table.spec.shards, self._batch_slots
            )
            if job is None or job.phase == Phase.done or table.stopped.is_set():
                return
            if job.current != failed_at:  # batches moved since the last failure
                retry.succeeded()
            failed_at = job.current
            retry.failed(self.clock())
            if table.stopped.wait(max(0.0, retry.next_at - self.clock())):
                return

    def _served_map(self, table: _Table) -> SlotMap | None:
        """The map every running node serves (they agree before a first move)."""
        while not table.stopped.wait(0.2):
            maps = [c.stats(table.spec.name) for c in list(table.clients)]
            if all(m is not None for m in maps):
                found = {m.slot_map for m in maps if m is not None}
                if len(found) == 1 and None not in found:
                    return found.pop()
        return None

    def _shards_of(self, table: _Table) -> resharding.Shards:
        def grow_to(count: int) -> None:
            with self._lock:
                while len(table.ports) < count:
                    table.ports.append((_free_port(), _free_port()))
                    grpc_port = table.ports[-1][0]
                    tls = self._tls.client if self._tls else None
                    table.clients.append(ShardClient(f"127.0.0.1:{grpc_port}", tls=tls))
                    table.node_ids.append(None)
                    _save_ports(table.directory / "ports.json", table.ports)
                    shard = len(table.ports) - 1
                    stop_leftover(_shard_dir(table, shard))
                    self._supervisor.start(self._process(table, shard))

        def serving(shard: int, slot_map: SlotMap) -> bool:
            client = table.clients[shard]
            if client.stats(table.spec.name) is not None:
                return True
            try:
                return client.ensure_table(table.spec, slot_map)
            except TableRefused as error:
                raise RuntimeError(f"shard {shard} refused the table: {error.reason}") from error

        def shrink_to(count: int) -> None:
            with self._lock:
                for shard in range(count, len(table.ports)):
                    self._supervisor.stop(_process_name(table.spec.name, shard))
                    table.clients[shard].close()
                before = len(table.ports)
                del table.ports[count:], table.clients[count:], table.node_ids[count:]
                _save_ports(table.directory / "ports.json", table.ports)
            resharding.remove_shard_dirs(table.directory, count, before)

        def report() -> None:
            try:
                self._report(table)
            except httpx.HTTPStatusError as error:
                log.warning("status report for %s refused: %s %s", table.spec.name, error,
                            error.response.text)  # fmt: skip
            except (httpx.HTTPError, RuntimeError) as error:
                log.warning("status report for %s failed: %s", table.spec.name, error)

        def show(progress: Resharding) -> None:
            table.moving = progress

        return resharding.Shards(
            name=table.spec.name,
            endpoints=lambda: [table.endpoint(s) for s in range(len(table.ports))],
            grow_to=grow_to, serving=serving, shrink_to=shrink_to, report=report, show=show,
            tls=self._tls.client if self._tls else None, closed=table.stopped,
            record=lambda event: self._reporter.record_move_event(table.spec.name, event),
        )  # fmt: skip


def _sizing_shards(table: _Table, shard: int) -> int:
    """The shard count a node is started with: it sizes its engine tables for that share
    (a target then grows them to what a move gives it, ``recstore.ps.capacity``).

    While a move runs, a shard kept by both counts is sized for the smaller one, as
    it may hold that share of the rows; the others for all the shards running.
    """
    job = table.store.job() if table.store is not None else None
    if job is not None and job.phase != Phase.done:
        kept = min(job.from_shards, job.to_shards)
        if shard < kept:
            return kept
    return len(table.ports)


def _save_ports(path: Path, ports: list[tuple[int, int]]) -> None:
    path.write_text(json.dumps(ports))


def _process_name(table: str, shard: int) -> str:
    return f"{table}/shard-{shard}"


def _load_or_pick_ports(path: Path, shards: int) -> list[tuple[int, int]]:
    """Ports a table's shards listened on before (as many as ran), else fresh free ports."""
    if path.exists():
        saved = [tuple(p) for p in json.loads(path.read_text())]
        if saved:
            return [(int(g), int(m)) for g, m in saved]
    ports = [(_free_port(), _free_port()) for _ in range(shards)]
    _save_ports(path, ports)
    return ports


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
