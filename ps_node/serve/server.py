"""A PS node inside this process: ``start_in_thread`` for synchronous callers.

The node runs the same ``PsServer`` as ``recstore ps-node`` on its own
event-loop thread; ``start_in_thread`` returns once it serves, and the
``ServerHandle`` stops it (with a final checkpoint unless told otherwise).
Tests, benchmarks and programs hosting a node in-process use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from pathlib import Path

from recstore.core import TableSpec
from recstore.core.limits import DEFAULT_MAX_BATCH_BYTES
from recstore.core.tls import ServerTls
from recstore.ps.serve.config import NodeConfig
from recstore.ps.serve.serving import PsServer
from recstore.ps.wal.segment_file import SegmentFile, SegmentOpener


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
