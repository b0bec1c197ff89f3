"""The ``recstore ps-node`` process: serve until signalled, exit with a status that says why.

SIGTERM or SIGINT (or the exit of ``--parent-pid``'s process, for the local
platform's nodes) stops the node with a final checkpoint. ``run`` maps what
ended it to the exit status: 0 stopped cleanly, 1 the final checkpoint or the
data dir failed, 2 a declared table conflicts with a hosted one, 3 another node
holds the data dir.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from recstore.core.data_dir import DataDirInUse, DataDirUnusable
from recstore.ps.serve import table_specs
from recstore.ps.serve.config import NodeConfig
from recstore.ps.serve.serving import FinalCheckpointFailed, PsServer

log = logging.getLogger(__name__)


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
