"""A serving PS node: gRPC server, health, reflection, metrics, checkpoints, shutdown.

``PsServer.start`` recovers the node's tables, creates the declared ones and
serves; ``stop`` stops accepting, drains in-flight calls, writes a final
checkpoint and releases the data dir. While the write-ahead log has failed,
health says NOT_SERVING and a probe tries to resume writes
(``recstore.ps.checkpoint.failstop``). How a process runs it: ``recstore.ps.serve.process``
(``recstore ps-node``) or ``recstore.ps.serve.server`` (its own thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from recstore.core import WritesStopped
from recstore.core.data_dir import DataDirLock
from recstore.core.errors import CheckpointCorrupt
from recstore.core.limits import grpc_options, message_limit
from recstore.core.reconcile import LIVENESS_SERVICE
from recstore.ps import native_path
from recstore.ps.checkpoint import failstop, persistence, recovery
from recstore.ps.node import Node
from recstore.ps.serve import auth, table_specs
from recstore.ps.serve import metrics as metrics_module
from recstore.ps.serve.config import NodeConfig
from recstore.ps.serve.native_server import FastPath, Method, NativeServer
from recstore.ps.serve.offload import Offload
from recstore.ps.serve.servicer import STEADY_METHODS, PsServicer, methods_of
from recstore.v1 import ps_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name
GRPC_OPTIONS = [("grpc.so_reuseport", 0)]  # message sizes: recstore.core.limits
#: reflection never changes a table
OPEN_METHODS = frozenset({f"/{reflection.SERVICE_NAME}/ServerReflectionInfo"})


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
        self.port = 0
        self.metrics_port: int | None = None
        self._grpc: NativeServer | None = None
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
        self.metrics.log_damaged(restored.log_damaged)
        declared = await loop.run_in_executor(
            self.executor, table_specs.declare, self.node, self.config.table_specs
        )
        servicer = PsServicer(
            self.node,
            self.offload,
            self.metrics,
            self.config.keep_checkpoints,
            reply_limit=message_limit(self.config.max_batch_bytes),
        )
        steady = {f"/{SERVICE_NAME}/{name}" for name in STEADY_METHODS}
        server = NativeServer(
            {**methods_of(servicer), **reflection_methods()},
            f"{self.config.host}:{self.config.port}",
            GRPC_OPTIONS + grpc_options(self.config.max_batch_bytes),
            auth.access(self.config.auth_token, self.config.read_only_token),
            self.config.tls,
            reply_limit=message_limit(self.config.max_batch_bytes),
            fast_path=FastPath(
                lambda: native_path.fast_tables(self.node), frozenset(steady | OPEN_METHODS)
            ),
            latency_bounds=metrics_module.LATENCY_BUCKETS,
        )
        self.metrics.add_native(server.fast_counts)
        self.port = await server.start()
        self._grpc = server
        changed = asyncio.Event()

        def on_change() -> None:  # on the thread that stopped or resumed writes
            loop.call_soon_threadsafe(changed.set)

        self.node.write_gate.subscribe(on_change)
        server.set_serving(LIVENESS_SERVICE, True)
        self._publish_health()
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

    @property
    def native_server(self) -> NativeServer | None:
        """The node's gRPC server while it serves."""
        return self._grpc

    def _publish_health(self) -> None:
        """SERVING while writes are accepted, NOT_SERVING while the log has failed."""
        if self._grpc is None:
            return
        serving = self.node.write_gate.fault is None
        for service in ("", SERVICE_NAME):
            self._grpc.set_serving(service, serving)

    async def _keep_writes_going(self, changed: asyncio.Event) -> None:
        """Follow the write gate: publish health, probe a failed log until writes resume."""
        while True:
            await changed.wait()
            changed.clear()
            self._publish_health()
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


def reflection_methods() -> dict[str, Method]:
    """Server reflection (grpcurl's discovery), answered by grpc_reflection's servicer."""
    names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
    servicer = ReflectionServicer(names)
    return {
        f"/{reflection.SERVICE_NAME}/ServerReflectionInfo": Method(
            servicer.ServerReflectionInfo,
            streamed_request=True,
            streamed_reply=True,
            read=reflection_pb2.ServerReflectionRequest.FromString,
            write=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }


class FinalCheckpointFailed(RuntimeError):
    """The node stopped, but its final checkpoint could not be written (logged already)."""
