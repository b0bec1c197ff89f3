"""Resuming writes after a write-ahead log failure: the probe that reopens the logs.

A node whose log failed accepts no writes (``recstore.ps.wal.write_gate``). The
server calls ``try_resume`` every ``NodeConfig.wal_probe_interval`` seconds
while writes are stopped: each failed log continues on a fresh segment (it
must be created, written and fsynced: the probe), and when memory holds writes
the log lost (an fsync failed after they were applied) a checkpoint makes
memory durable before any new write is logged on top of it. Only then does the
gate open. While the disk still fails nothing changes and the next probe tries
again; a restart instead recovers from checkpoint and log as usual.
"""

from __future__ import annotations

import logging

from recstore.core import WritesStopped
from recstore.ps.checkpoint import persistence
from recstore.ps.node import Node

log = logging.getLogger(__name__)


def try_resume(node: Node, keep: int = 3) -> bool:
    """Reopen every failed log (and checkpoint if needed); True once writes are accepted."""
    gate = node.write_gate
    if gate.fault is None:
        return True
    trips = gate.trips()  # a log failing meanwhile keeps writes stopped (the next probe)
    with node.registry_lock:
        try:
            for name, hosted in sorted(node.tables.items()):
                if hosted.wal is not None and hosted.wal.fault is not None:
                    with hosted.lock:
                        hosted.wal.reopen()
                    log.info("wal: table %r continues on a fresh segment", name)
            if gate.needs_checkpoint:  # memory and log disagree: memory is what was answered
                persistence.save(node, None, keep)
        except (OSError, WritesStopped) as error:
            log.warning("write-ahead log still failing: %s", error)
            return False
        return gate.reopen(trips)
