"""Driving a table's move to a new shard count, for any provisioner.

``recstore.core.reshard.protocol`` runs the protocol's batches against nodes; a
provisioner also has to start the new shards first, wait until each serves
the table (created with the moving map), report progress, and stop the
emptied shards last. That sequence is the same for the local provisioner and
the Kubernetes operator, so it lives here; each supplies ``Shards`` (how its
world starts, reaches and stops shards) and a ``JobRecord`` (where the slot map
and the job live durably: a JSON file, the CR status). A try that stops is
counted in the change's ``Tries`` (``recstore.core.reshard.retry``), so its
status and events say which attempt it was and when the next one starts;
the provisioner waits that long and calls ``move`` again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from recstore.core.control import ControlClient, ControlError, stats_rpc
from recstore.core.reconcile import Resharding
from recstore.core.reshard.events import ReshardEvent, ReshardMoment
from recstore.core.reshard.plan import (
    DEFAULT_BATCH_SLOTS,
    Phase,
    ReshardJob,
    sized_batch_slots,
)
from recstore.core.reshard.protocol import JobStore, ReshardRun
from recstore.core.reshard.retry import ONE_TRY, Tries
from recstore.core.routing import SlotMap
from recstore.core.tls import ClientTls

log = logging.getLogger(__name__)

#: a reshard step's deadline (a snapshot page, a seal, a checksum of a batch)
STEP_TIMEOUT_S = 120.0
#: why a move stops when its provisioner does
STOPPING = "the provisioner is stopping"


class JobRecord(JobStore, Protocol):
    """A ``JobStore`` that also reads back the stored job (to resume it)."""

    def job(self) -> ReshardJob | None: ...


def progress(
    job: ReshardJob, epoch: int, tries: Tries, *, running: bool, error: str | None = None
) -> Resharding:
    return Resharding(
        job.from_shards, job.to_shards, job.slots_moved, job.slots_total, job.bytes_moved,
        epoch, running=running, error=error, attempt=tries.attempt,
        retry_in_s=tries.retry_in_s if error is not None else None,
    )  # fmt: skip


@dataclass
class Shards:
    """What the resharder needs from the provisioner for one table."""

    name: str
    endpoints: Callable[[], list[str]]
    grow_to: Callable[[int], None]  # start shards up to this count
    serving: Callable[[int, SlotMap], bool]  # has shard i the table (created with this map)?
    shrink_to: Callable[[int], None]  # stop the shards from this count on
    report: Callable[[], None]  # report the status now (the new map before the source refuses)
    show: Callable[[Resharding], None]  # the progress the status shows
    tls: ClientTls | None
    closed: threading.Event
    token: str | None = None
    #: the audit log / Kubernetes Events of the move's moments (best effort)
    record: Callable[[ReshardEvent], None] = lambda event: None

    def note(self, moment: ReshardMoment, job: ReshardJob, epoch: int, **extra: Any) -> None:
        """Record a moment; a recording that fails is logged, never a reason to stop a move."""
        try:
            self.record(ReshardEvent.of(moment, job, epoch, **extra))
        except Exception:
            log.exception("recording %s of %s's move failed", moment.value, self.name)


def rows_per_slot(shards: Shards, slot_map: SlotMap) -> float:
    """The most resident rows per owned slot among the shards the map names (0: none could
    be read): what sizes a new move's batches (``sized_batch_slots``)."""
    owners = slot_map.owner_table()
    densest = 0.0
    for index, endpoint in enumerate(shards.endpoints()[: slot_map.num_shards]):
        owned = int((owners == index).sum())
        client = ControlClient(endpoint, timeout=STEP_TIMEOUT_S, tls=shards.tls, token=shards.token)
        try:
            rows = client.call(stats_rpc(shards.name)).size
        except ControlError:  # a shard not serving yet: the others (or the default) decide
            continue
        finally:
            client.close()
        if owned:
            densest = max(densest, rows / owned)
    return densest


def reshard(
    shards: Shards,
    store: JobRecord,
    to_shards: int,
    batch_slots: int = DEFAULT_BATCH_SLOTS,
    tries: Tries | None = None,
    copy_rate: float = 0.0,
) -> ReshardJob | None:
    """Move the table to ``to_shards`` (or finish the stored job first); None when stopped.

    ``copy_rate``: bytes per second each batch's copy before its seal may move (0: no
    cap; ``recstore.core.reshard.pace``).

    A failed try returns the stored job (not done) with ``tries`` told of it: its
    ``retry_in_s`` is the wait before the next call (None: no retry follows)."""
    tries = tries or Tries(ONE_TRY)
    job = store.job()
    resuming = job is not None and job.phase != Phase.done
    if job is None or not resuming:
        densest = rows_per_slot(shards, store.slot_map())
        job = ReshardJob.start(
            shards.name, store.slot_map(), to_shards, sized_batch_slots(densest, batch_slots)
        )
    assert job is not None
    shards.show(progress(job, store.slot_map().epoch, tries, running=True))
    moment = ReshardMoment.resumed if resuming else ReshardMoment.started
    shards.note(moment, job, store.slot_map().epoch, attempt=tries.attempt)
    widest = max(job.from_shards, job.to_shards)
    shards.grow_to(widest)
    for shard in range(widest):
        while not shards.serving(shard, store.slot_map()):
            if shards.closed.wait(0.2):
                shards.note(ReshardMoment.aborted, job, store.slot_map().epoch, reason=STOPPING,
                            attempt=tries.attempt)  # fmt: skip
                return None
    clients = [
        ControlClient(e, timeout=STEP_TIMEOUT_S, tls=shards.tls, token=shards.token)
        for e in shards.endpoints()
    ]

    def on_step(step: str, current: ReshardJob) -> None:
        if shards.closed.is_set():
            raise RuntimeError(STOPPING)
        epoch = store.slot_map().epoch
        shards.show(progress(current, epoch, tries, running=True))
        if step == "activate":  # the batch's commit happened (or a resumed one's had)
            shards.note(ReshardMoment.batch_committed, current, epoch, attempt=tries.attempt)
            shards.report()

    run = ReshardRun(shards.name, clients, store, on_step=on_step, copy_rate=copy_rate)
    try:
        job = run.resume(job) if resuming else run.run(job)
    except Exception as error:
        failed = store.job() or job
        epoch = store.slot_map().epoch
        count_failed_try(tries, failed.slots_moved, shards.closed)
        shards.show(progress(failed, epoch, tries, running=False, error=str(error)))
        log.exception("resharding %s to %d shards stopped", shards.name, to_shards)
        shards.note(ReshardMoment.aborted, failed, epoch, reason=str(error), attempt=tries.attempt,
                    retry_in_s=tries.retry_in_s)  # fmt: skip
        return failed
    finally:
        for client in clients:
            client.close()
    shards.shrink_to(job.to_shards)
    epoch = store.slot_map().epoch
    shards.show(progress(job, epoch, tries, running=False))
    shards.report()
    shards.note(ReshardMoment.finished, job, epoch, attempt=tries.attempt)
    return job


def count_failed_try(tries: Tries, slots_moved: int, closed: threading.Event) -> None:
    """Count a try that stopped with ``slots_moved`` moved; one stopped by its provisioner
    stopping plans no retry (the next start resumes the stored job)."""
    tries.failed(slots_moved)
    if closed.is_set():
        tries.retry_in_s = None
