"""Online resharding on the local platform: a table's move to a new shard count.

A new ``shards`` in ``update_table`` (or one found on start) runs here, in a
thread of its own, the protocol of ``recstore.core.migration_run``: growing
starts the new nodes first (sized for the new count, owning no slot yet);
the batches move; shrinking stops the emptied highest shards last. The slot
map and the job live in the table's ``migration.json`` (``FileJobStore``), so
a restarted provisioner resumes: it finishes a committed batch, aborts any
other, and moves the rest. Progress goes to the status as the ``Resharding``
phase and condition; after each commit the new map is reported to the admin
API before the source starts refusing the moved slots, so a refused client
finds the new map when it refreshes.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recstore.core.control import ControlClient
from recstore.core.migration import DEFAULT_BATCH_SLOTS, MigrationJob, Phase
from recstore.core.migration_run import MigrationRun
from recstore.core.reconcile import Resharding
from recstore.core.routing import SlotMap
from recstore.core.tls import ClientTls
from recstore.local.migration_store import FileJobStore

log = logging.getLogger(__name__)

#: how long new shards may take to start serving before the move gives up (nothing moved)
START_TIMEOUT_S = 120.0
#: a migration step's deadline (a snapshot page, a seal, a checksum of a batch)
STEP_TIMEOUT_S = 120.0


def job_store(directory: Path, served: SlotMap | None) -> FileJobStore | None:
    """The table's store: the existing one, else a new one from the nodes' map (None: unknown)."""
    path = directory / "migration.json"
    if path.exists() or served is not None:
        return FileJobStore(path, served or SlotMap.initial(1))
    return None


def progress(
    job: MigrationJob, epoch: int, *, running: bool, error: str | None = None
) -> Resharding:
    return Resharding(
        job.from_shards, job.to_shards, job.slots_moved, job.slots_total, job.bytes_moved,
        epoch, running=running, error=error,
    )  # fmt: skip


@dataclass
class Shards:
    """What the mover needs from the provisioner for one table."""

    name: str
    directory: Path
    endpoints: Callable[[], list[str]]
    grow_to: Callable[[int], None]  # start shards up to this count (ports, processes)
    serving: Callable[[int, SlotMap], bool]  # has shard i the table (created with this map)?
    shrink_to: Callable[[int], None]  # stop the shards from this count on
    report: Callable[[], None]  # report the status now (the new map before the source refuses)
    show: Callable[[Resharding], None]  # the progress the status shows
    tls: ClientTls | None
    closed: threading.Event


def move(
    shards: Shards, store: FileJobStore, to_shards: int, batch_slots: int = DEFAULT_BATCH_SLOTS
) -> MigrationJob | None:
    """Move the table to ``to_shards`` (or finish the stored job first); None when stopped."""
    job = store.job()
    resuming = job is not None and job.phase != Phase.done
    if job is None or not resuming:
        job = MigrationJob.start(shards.name, store.slot_map(), to_shards, batch_slots)
    assert job is not None
    shards.show(progress(job, store.slot_map().epoch, running=True))
    widest = max(job.from_shards, job.to_shards)
    shards.grow_to(widest)
    for shard in range(widest):
        while not shards.serving(shard, store.slot_map()):
            if shards.closed.wait(0.2):
                return None
    clients = [ControlClient(e, timeout=STEP_TIMEOUT_S, tls=shards.tls) for e in shards.endpoints()]

    def on_step(step: str, current: MigrationJob) -> None:
        if shards.closed.is_set():
            raise RuntimeError("the provisioner is stopping")
        shards.show(progress(current, store.slot_map().epoch, running=True))
        if step == "activate":
            shards.report()

    run = MigrationRun(shards.name, clients, store, on_step=on_step)
    try:
        job = run.resume(job) if resuming else run.run(job)
    except Exception as error:
        failed = store.job() or job
        shards.show(progress(failed, store.slot_map().epoch, running=False, error=str(error)))
        log.exception("resharding %s to %d shards stopped", shards.name, to_shards)
        return failed
    finally:
        for client in clients:
            client.close()
    shards.shrink_to(job.to_shards)
    shards.show(progress(job, store.slot_map().epoch, running=False))
    shards.report()
    return job


def remove_shard_dirs(directory: Path, start: int, end: int) -> None:
    for shard in range(start, end):
        shutil.rmtree(directory / f"shard-{shard}", ignore_errors=True)
