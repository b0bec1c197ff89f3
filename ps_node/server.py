"""Process wiring of a PS node: gRPC server, health, reflection, metrics, shutdown.

``run`` is the ``recstore ps-node`` path (SIGTERM: stop accepting, drain
in-flight calls, write a final checkpoint, exit 0); ``start_in_thread`` runs
the same server on its own event-loop thread for synchronous callers. While
the write-ahead log has failed, health says NOT_SERVING and a probe tries to
resume writes (``recstore.ps.failstop``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from recstore.core import TableSpec, WritesStopped
from recstore.core.data_dir import DataDirInUse, DataDirLock, DataDirUnusable
from recstore.core.limits import DEFAULT_MAX_BATCH_BYTES, message_limit
from recstore.core.reconcile import LIVENESS_SERVICE
from recstore.core.tls import ServerTls
from recstore.ps import failstop, limits, persistence, recovery, table_specs
from recstore.ps import metrics as metrics_module
from recstore.ps.auth import TokenAuth
from recstore.ps.checkpoint import CheckpointCorrupt
from recstore.ps.node import Node
from recstore.ps.offload import Offload
from recstore.ps.servicer import PsServicer, add_to_server
from recstore.ps.wal_io import SegmentFile, SegmentOpener
from recstore.v1 import ps_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name
GRPC_OPTIONS = [("grpc.so_reuseport", 0)]  # message sizes: recstore.ps.limits


@dataclass
class NodeConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    shard_index: int = 0
    num_shards: int = 1
    device: str = "cpu"
    auth_token: str | None = None
    #: a second token whose holders may only read (recstore.ps.auth.READ_ONLY_METHODS)
    read_only_token: str | None = None
    durability: str = "checkpoint"  # or "wal"
    checkpoint_interval: float = 0.0  # seconds; 0: no periodic checkpoints
    keep_checkpoints: int = 3
    metrics_port: int | None = None
    drain_seconds: float = 30.0
    #: stop (with a final checkpoint) when this process exits: the local platform's nodes
    parent_pid: int | None = None
    #: tables to host, created at start after recovery (``--table-spec-file``)
    table_specs: list[TableSpec] = field(default_factory=list)
    #: payload bytes of one request or reply, at most (``--max-batch-bytes``; recstore.ps.limits)
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    #: seconds between attempts to resume writes after the write-ahead log failed
    wal_probe_interval: float = 5.0
    #: how log segments are opened (tests pass files that fail like a broken disk)
    wal_files: SegmentOpener = SegmentFile
    #: serve gRPC over TLS (mutual TLS when it names a client CA); None: plaintext
    tls: ServerTls | None = None

    def __post_init__(self) -> None:
        if self.durability not in ("checkpoint", "wal"):
            raise ValueError(f"durability must be checkpoint or wal, got {self.durability!r}")
        if self.keep_checkpoints < 1:
            raise ValueError("keep_checkpoints must be at least 1")
        message_limit(self.max_batch_bytes)  # refuses a bound gRPC cannot carry
        if not self.wal_probe_interval > 0:
            raise ValueError("wal_probe_interval must be positive")
        if self.read_only_token is not None and not self.auth_token:
            # without an auth token every caller may write: a read-only one would mean nothing
            raise ValueError("a read-only token needs an auth token")
        if self.read_only_token is not None and self.read_only_token == self.auth_token:
            raise ValueError("the read-only token must differ from the auth token")


class PsServer:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        # before anything else reads or writes the dir: a second node there touches nothing
        self._lock = DataDirLock.acquire(config.data_dir)
        try:
            self.node = Node(
                config.data_dir,
                shard_index=config.shard_index,
                num_shards=config.num_shards,
                device=config.device,
                wal_enabled=config.durability == "wal",
                wal_files=config.wal_files,
            )
        except BaseException:
            self._lock.release()
            raise
        self.metrics = metrics_module.Metrics(
            lambda: dict(self.node.tables),
            self.node.write_gate,
            lambda: dict(self.node.refused),
            self.node.cache_reports.of,
        )
        self.executor = ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 2) + 2)
        self.offload = Offload(self.executor)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.metrics_port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        self._metrics_http: Any = None
        self._periodic: asyncio.Task[None] | None = None
        self._writes_watch: asyncio.Task[None] | None = None

    async def start(self) -> int:
        try:
            return await self._start()
        except BaseException:
            self._lock.release()
            raise

    async def _start(self) -> int:
        loop = asyncio.get_running_loop()
        restored = await loop.run_in_executor(
            self.executor, recovery.recover, self.node, self.metrics.checkpoint_damaged
        )
        declared = await loop.run_in_executor(
            self.executor, table_specs.declare, self.node, self.config.table_specs
        )
        interceptors = (
            [TokenAuth(self.config.auth_token, self.config.read_only_token)]
            if self.config.auth_token
            else []
        )
        server = grpc.aio.server(
            migration_thread_pool=None,
            interceptors=interceptors,
            options=GRPC_OPTIONS + limits.grpc_options(self.config.max_batch_bytes),
        )
        servicer = PsServicer(
            self.node,
            self.offload,
            self.metrics,
            self.config.keep_checkpoints,
            reply_limit=message_limit(self.config.max_batch_bytes),
        )
        add_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        address = f"{self.config.host}:{self.config.port}"
        if self.config.tls is not None:
            self.port = server.add_secure_port(address, self.config.tls.grpc_credentials())
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._grpc = server
        changed = asyncio.Event()

        def on_change() -> None:  # on the thread that stopped or resumed writes
            loop.call_soon_threadsafe(changed.set)

        self.node.write_gate.subscribe(on_change)
        await self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await self._publish_health()
        self._writes_watch = asyncio.create_task(self._keep_writes_going(changed))
        if self.config.metrics_port is not None:
            self._metrics_http, self.metrics_port = metrics_module.serve(
                self.metrics, self.config.metrics_port, self.config.host
            )
        if self.config.checkpoint_interval > 0:
            self._periodic = asyncio.create_task(self._checkpoint_periodically())
        log.info(
            "ps node serving",
            extra={
                "port": self.port,
                "metrics_port": self.metrics_port,
                "shard_index": self.config.shard_index,
                "num_shards": self.config.num_shards,
                "durability": self.config.durability,
                "tls": self.config.tls.mode if self.config.tls else "off",
                "tables": sorted(self.node.tables),
                "restored_checkpoint": restored.newest.checkpoint_id if restored.newest else None,
                "refused_tables": restored.refused,
                "declared_tables_created": declared,
            },
        )
        return self.port

    async def _publish_health(self) -> None:
        """SERVING while writes are accepted, NOT_SERVING while the log has failed."""
        stopped = self.node.write_gate.fault is not None
        status = health_pb2.HealthCheckResponse
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status.NOT_SERVING if stopped else status.SERVING)

    async def _keep_writes_going(self, changed: asyncio.Event) -> None:
        """Follow the write gate: publish health, probe a failed log until writes resume."""
        while True:
            await changed.wait()
            changed.clear()
            await self._publish_health()
            while self.node.write_gate.fault is not None:
                await asyncio.sleep(self.config.wal_probe_interval)
                try:
                    await self.offload.run(self._try_resume)
                except Exception:  # a bug: keep probing, never leave health stale
                    log.exception("resuming writes failed")

    def _try_resume(self) -> bool:
        return failstop.try_resume(self.node, self.config.keep_checkpoints)

    async def _save(self) -> None:
        info = await self.offload.run(
            persistence.save,
            self.node,
            None,
            self.config.keep_checkpoints,
            self.metrics.checkpoint_damaged,
        )
        self.metrics.checkpointed(info)

    async def _checkpoint_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.checkpoint_interval)
            if self.node.tables and self.node.write_gate.fault is None:  # else: the probe
                try:
                    await self._save()
                except Exception:
                    log.exception("periodic checkpoint failed")

    async def stop(self, final_checkpoint: bool = True) -> None:
        """Stop accepting, drain in-flight calls, write a final checkpoint, release."""
        if self._grpc is None:
            return
        server, self._grpc = self._grpc, None
        await self.health.enter_graceful_shutdown()
        await server.stop(self.config.drain_seconds)
        for task in (self._periodic, self._writes_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        failure: Exception | None = None
        if final_checkpoint and self.node.tables:
            try:
                await self.offload.run(self._try_resume)  # a failed log is reopened first
                await self._save()
                log.info("final checkpoint written")
            # e.g. a read-only or full data dir, or a write that did not verify: say so, stop
            except (OSError, WritesStopped, CheckpointCorrupt) as error:
                failure = error
                log.error(
                    "final checkpoint failed: %s; the data dir keeps the previous checkpoint",
                    error, extra={"data_dir": str(self.config.data_dir)},
                )  # fmt: skip
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        for hosted in list(self.node.tables.values()):
            if hosted.wal is not None:
                hosted.wal.close()
        self.executor.shutdown(wait=True)
        self._lock.release()
        log.info("ps node stopped")
        if failure is not None:
            raise FinalCheckpointFailed(str(failure)) from failure


class FinalCheckpointFailed(RuntimeError):
    """The node stopped, but its final checkpoint could not be written (logged already)."""


async def serve_until_signalled(config: NodeConfig) -> None:
    try:
        server = PsServer(config)
    except OSError as error:  # recovery and the catalogue need a readable, writable dir
        raise DataDirUnusable(config.data_dir, error) from error
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):  # before "serving" is logged
        loop.add_signal_handler(signum, stop.set)
    if config.parent_pid is not None:
        _stop_with_parent(loop, config.parent_pid, stop)
    try:
        await server.start()
    except OSError as error:
        raise DataDirUnusable(config.data_dir, error) from error
    await stop.wait()
    log.info("shutting down: draining in-flight calls")
    await server.stop(final_checkpoint=True)


def _stop_with_parent(loop: asyncio.AbstractEventLoop, pid: int, stop: asyncio.Event) -> None:
    """Set ``stop`` when process ``pid`` exits, however it exits (a pidfd turns readable)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        log.warning("parent process %d is gone: shutting down", pid)
        stop.set()
        return

    def parent_exited() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        log.warning("parent process %d exited: shutting down", pid)
        stop.set()

    loop.add_reader(pidfd, parent_exited)


def run(config: NodeConfig) -> int:
    """Serve until SIGTERM (0; 1 when the final checkpoint could not be written); 2 when a
    declared table conflicts with a hosted one, 3 when another node holds the data dir."""
    try:
        asyncio.run(serve_until_signalled(config))
    except table_specs.TableDeclarationError as error:
        log.error(str(error), extra={"table": error.table, "fields": error.fields})
        return 2
    except DataDirInUse as error:
        log.error(str(error), extra={"data_dir": str(error.data_dir), "holder": error.pid})
        return 3
    except DataDirUnusable as error:
        log.error(str(error), extra={"data_dir": str(error.data_dir)})
        return 1
    except FinalCheckpointFailed:
        return 1  # the reason is logged
    return 0


class ServerHandle:
    """A node running on its own event-loop thread."""

    def __init__(self, server: PsServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread):
        self.server = server
        self._loop = loop
        self._thread = thread

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return f"{self.server.config.host}:{self.port}"

    @property
    def metrics_port(self) -> int | None:
        return self.server.metrics_port

    def stop(self, final_checkpoint: bool = True) -> None:
        if self._thread.is_alive():
            future = asyncio.run_coroutine_threadsafe(
                self.server.stop(final_checkpoint), self._loop
            )
            try:
                future.result()
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    data_dir: str | os.PathLike[str],
    shard_index: int = 0,
    num_shards: int = 1,
    device: str = "cpu",
    auth_token: str | None = None,
    read_only_token: str | None = None,
    durability: str = "checkpoint",
    checkpoint_interval: float = 0.0,
    keep_checkpoints: int = 3,
    metrics_port: int | None = None,
    table_specs: list[TableSpec] | None = None,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    wal_probe_interval: float = 5.0,
    wal_files: SegmentOpener = SegmentFile,
    tls: ServerTls | None = None,
) -> ServerHandle:
    """Start a node in a background thread; returns once it serves (``.port``, ``.stop()``)."""
    config = NodeConfig(
        data_dir=Path(data_dir),
        host=host,
        port=port,
        shard_index=shard_index,
        num_shards=num_shards,
        device=device,
        auth_token=auth_token,
        read_only_token=read_only_token,
        durability=durability,
        checkpoint_interval=checkpoint_interval,
        keep_checkpoints=keep_checkpoints,
        metrics_port=metrics_port,
        table_specs=list(table_specs or []),
        max_batch_bytes=max_batch_bytes,
        wal_probe_interval=wal_probe_interval,
        wal_files=wal_files,
        tls=tls,
    )
    server = PsServer(config)
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[int] = concurrent.futures.Future()

    async def boot() -> None:
        try:
            started.set_result(await server.start())
        except BaseException as error:
            started.set_exception(error)

    def main() -> None:
        asyncio.set_event_loop(loop)
        boot_task = loop.create_task(boot())
        loop.run_forever()
        del boot_task
        loop.close()

    thread = threading.Thread(target=main, name=f"ps-node-{port}", daemon=True)
    thread.start()
    try:
        started.result()
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        raise
    return ServerHandle(server, loop, thread)
