"""Running a reshard job against live nodes: the protocol's steps, in order.

Shared by the provisioners (the local one now, the operator later): they
supply the nodes' control clients and a ``JobStore`` (where the job record and
the slot map live durably, with the compare-and-swap commit); this runs each
batch of ``recstore.core.reshard.plan``'s plan:

  begin (target importing, source tracking) -> snapshot pages -> catch-up
  rounds -> seal (the tail) -> import it (with the target's checksums) while
  the source hashes its sealed slots -> checksums equal? -> commit (CAS e ->
  e+1) -> the new map to the target (its checksums at the install equal the
  seal's) and the source (it now refuses the slots) at once -> every other
  node (the epoch) -> cleanup on the source.

Everything from the seal to the source's refusal is the batch's write pause:
the target's checksums travel in the reply of the import it makes anyway (it
keeps them as rows arrive, ``recstore.ps.reshard.import_sums``), and the source's pass
over its sealed slots runs beside that import. The copy before it runs on
background threads (``recstore.core.background``): the trainers' requests and
the pause go first.

A failure before the commit aborts the batch: the source unseals and stays
authoritative, the target drops what it imported. After the commit the batch
is finished, whatever failed. ``resume`` does the same for a job found half
done after a restart. ``on_step`` is called with each step's name before it
runs (progress, and where tests inject faults).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from recstore.core import malloc_tuning
from recstore.core.background import background_pool
from recstore.core.control import ControlClient
from recstore.core.errors import RecStoreError
from recstore.core.reshard.capacity import check_targets
from recstore.core.reshard.messages import (
    SOURCE,
    TARGET,
    Checksums,
    abort_rpc,
    activate_rpc,
    begin_rpc,
    checksums_rpc,
    cleanup_rpc,
    import_checked_rpc,
    import_rpc,
    release_source_rpc,
    rows_rpc,
    seal_rpc,
    set_slot_map_rpc,
)
from recstore.core.reshard.pace import CopyPace
from recstore.core.reshard.plan import Phase, ReshardJob, ResumeAction, moved, resume_action
from recstore.core.routing import SlotMap
from recstore.v1 import ps_pb2

log = logging.getLogger(__name__)

#: a catch-up round returning fewer changed rows than this goes on to the seal
CATCH_UP_LAG_ROWS = 2048
CATCH_UP_ROUNDS = 4
#: how long the source may take to drain running requests when sealing
SEAL_TIMEOUT_S = 5.0


class ReshardFailed(RecStoreError):
    """A batch could not be moved (aborted: the source is still authoritative)."""


class JobStore(Protocol):
    """Where a provisioner keeps a table's slot map and reshard job, durably."""

    def slot_map(self) -> SlotMap: ...

    def save_job(self, job: ReshardJob | None) -> None: ...

    def commit(self, expected_epoch: int, slot_map: SlotMap) -> bool:
        """Store ``slot_map`` if the stored epoch is ``expected_epoch`` (the one commit point)."""
        ...


@dataclass
class BatchRecord:
    """What a batch did: its checksums at the seal and at activation, its write pause."""

    batch: int
    seal_checksums: Checksums
    activation_checksums: Checksums
    pause_s: float  # seal call to the source's reply to the new map
    bytes: int
    held_s: float = 0.0  # on the source: seal to its held writes being refused


@dataclass
class ReshardRun:
    table: str
    clients: Sequence[ControlClient]  # by shard index
    store: JobStore
    on_step: Callable[[str, ReshardJob], None] = lambda step, job: None
    seal_timeout: float = SEAL_TIMEOUT_S
    #: bytes per second the copy before each seal may move (0: no cap; recstore.core.reshard.pace)
    copy_rate: float = 0.0
    records: list[BatchRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        # each page passes through this process as megabytes of messages (malloc_tuning)
        malloc_tuning.apply_once()

    def run(self, job: ReshardJob) -> ReshardJob:
        """Move every remaining batch; returns the finished job (phase done).

        CapacityExhausted, before any batch, when a target cannot grow to what it will own.
        """
        check_targets(self.table, self.clients, job, self.store.slot_map())
        while job.phase != Phase.done:
            job = self.batch(job)
        self.store.save_job(job)
        return job

    def resume(self, job: ReshardJob) -> ReshardJob:
        """Finish or abort the batch a previous run left, then run the rest."""
        action = resume_action(job, self.store.slot_map().epoch)
        if action == ResumeAction.finish:
            job = self._finish(job, self.store.slot_map(), None, time.perf_counter(), 0)
        elif action == ResumeAction.abort:
            self._abort(job)
            job = job.at(Phase.copying)
        return self.run(job)

    def batch(self, job: ReshardJob) -> ReshardJob:
        batch = job.batch
        source, target = self.clients[batch.source], self.clients[batch.target]
        self.store.save_job(job.at(Phase.copying))
        try:
            self._step("begin", job)
            target.call(begin_rpc(self.table, TARGET, batch.ranges, batch.target))
            source.call(begin_rpc(self.table, SOURCE, batch.ranges, batch.target))
            with background_pool(1, "reshard-copy") as copier:  # the trainers go first
                moved_bytes = copier.submit(self._copy, job, source, target).result()
            self._step("seal", job)
            paused = time.perf_counter()
            tail = source.call(seal_rpc(self.table, self.seal_timeout))
            job = job.at(Phase.sealed)
            self.store.save_job(job)
            self._step("tail", job)
            # the source hashes its sealed slots while the target imports the tail (the
            # last import's reply carries the target's checksums): the pause's one pass
            # over the batch's rows runs beside the import, not after it
            (imported, tail_bytes), sealed = at_once(
                lambda: self._import_tail(source, target, tail),
                lambda: source.call(checksums_rpc(self.table, batch.ranges)),
            )
            moved_bytes += tail_bytes
            self._step("verify", job)
            if imported is None:  # a target that does not send them along
                imported = target.call(checksums_rpc(self.table, batch.ranges))
            differing = sealed.differing(imported)
            if differing:
                raise ReshardFailed(
                    f"table {self.table!r}: {len(differing)} slots differ after the tail "
                    f"(first {differing[:5]})"
                )
            self._step("commit", job)
            current = self.store.slot_map()
            if current.epoch != job.base_epoch or not self.store.commit(
                job.base_epoch, moved(current, batch)
            ):
                raise ReshardFailed(
                    f"table {self.table!r}: the slot map moved on from epoch {job.base_epoch}"
                )
        except Exception:  # a crash (the process gone) aborts nothing: resume does
            self._abort(job)
            raise
        job = job.at(Phase.committed)
        self.store.save_job(job)
        return self._finish(job, self.store.slot_map(), sealed, paused, moved_bytes)

    def _copy(self, job: ReshardJob, source: ControlClient, target: ControlClient) -> int:
        """Snapshot pages, then catch-up rounds until the change lag is small; returns the
        bytes copied (counted by the pace that holds them to ``copy_rate``)."""
        pace = CopyPace(self.copy_rate)
        self._step("snapshot", job)

        def page_at(offset: int) -> ps_pb2.MigrationRows:
            return source.call(rows_rpc(self.table, changes=False, offset=offset, max_rows=0))

        # pipelined: the source reads the next page while the target writes this one
        with background_pool(1, "reshard-read") as reader:
            pending = reader.submit(page_at, 0)
            while True:
                page = pending.result()
                if page.next_offset:
                    pending = reader.submit(page_at, page.next_offset)
                target.call(import_rpc(self.table, page))
                pace.count(rows_bytes(page))
                if not page.next_offset:
                    break
        self._step("catch-up", job)
        for _ in range(CATCH_UP_ROUNDS):
            changes = source.call(rows_rpc(self.table, changes=True))
            target.call(import_rpc(self.table, changes))
            pace.count(rows_bytes(changes))
            if changes.rows < CATCH_UP_LAG_ROWS and not changes.next_offset:
                break
        return pace.copied

    def _import_tail(
        self, source: ControlClient, target: ControlClient, tail: ps_pb2.MigrationRows
    ) -> tuple[Checksums | None, int]:
        """Import the tail (and its rest, still sealed, when it was larger than one reply);
        returns the target's checksums after the last rows, and the bytes moved."""
        rows, moved_bytes = tail, 0
        while True:
            moved_bytes += rows_bytes(rows)
            if not rows.next_offset:
                return target.call(import_checked_rpc(self.table, rows)), moved_bytes
            target.call(import_rpc(self.table, rows))
            rows = source.call(rows_rpc(self.table, changes=True))

    def _finish(
        self,
        job: ReshardJob,
        committed: SlotMap,
        sealed: Checksums | None,
        paused: float,
        moved_bytes: int,
    ) -> ReshardJob:
        """After the commit: the new map to the target and the source at once, then to every
        other node; clean up on the source."""
        batch, expected = job.batch, committed.epoch - 1
        self._step("activate", job)
        # target and source learn the map at once: a write the source refuses before the
        # target serves waits for it (the client's map is then ahead of the target's), so
        # the order changes no outcome, and one round trip less is spent in the pause. The
        # target's checksums are taken in the same hold as its install; the others learn
        # the epoch after
        target, source = self.clients[batch.target], self.clients[batch.source]
        at_install, held = at_once(
            lambda: target.call(activate_rpc(self.table, expected, committed, batch.ranges)),
            lambda: source.call(release_source_rpc(self.table, expected, committed)),
        )
        pause = time.perf_counter() - paused
        # a target that does not send them along is asked now: trainers' writes may have
        # reached it since the install, so a difference there says less (it is only logged)
        activated = at_install
        if activated is None:
            activated = target.call(checksums_rpc(self.table, batch.ranges))
        if sealed is not None and sealed.differing(activated):
            log.error("table %r: target's slots changed between seal and activation", self.table)
        for shard in range(len(self.clients)):
            if shard not in (batch.source, batch.target):
                self.clients[shard].call(set_slot_map_rpc(self.table, expected, committed))
        self._step("cleanup", job)
        self.clients[batch.source].call(cleanup_rpc(self.table))
        if sealed is not None:
            record = BatchRecord(job.current, sealed, activated, pause, moved_bytes, held)
            self.records.append(record)
        job = job.next_batch(committed.epoch, moved_bytes)
        self.store.save_job(job)
        return job

    def _abort(self, job: ReshardJob) -> None:
        """Unseal the source (still authoritative) and discard the target's import; a node
        that cannot be reached is told again by the next attempt or by its own restart."""
        batch = job.batch
        for shard, role in ((batch.source, SOURCE), (batch.target, TARGET)):
            try:
                self.clients[shard].call(abort_rpc(self.table, role))
            except RecStoreError as error:
                log.warning("abort on shard %d of %r failed: %s", shard, self.table, error)

    def _step(self, step: str, job: ReshardJob) -> None:
        self.on_step(step, job)


def rows_bytes(rows: ps_pb2.MigrationRows) -> int:
    """The row bytes a reshard message moves (keys, values, optimizer state)."""
    return len(rows.keys) + len(rows.values) + len(rows.state)


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run calls to different nodes concurrently (each waits on its own node); the first
    error is raised once all have finished."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]
