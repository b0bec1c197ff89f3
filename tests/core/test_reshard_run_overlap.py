"""The reshard runner overlaps calls to different nodes where the protocol allows it.

Snapshot pages are pipelined (the source reads the next page while the target
writes this one), and the source hashes its sealed slots while the target
imports the tail. Fake nodes check the overlap with events: a call that must
overlap another waits for it to have started, and fails the move when it never
does (the sequential runner).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recstore.core.control import Rpc
from recstore.core.proto_convert import TableStats
from recstore.core.reshard.messages import Checksums
from recstore.core.reshard.plan import Phase, ReshardJob
from recstore.core.reshard.protocol import ReshardRun
from recstore.core.routing import SlotMap
from recstore.v1 import ps_pb2

#: how long a fake node waits for the call that should be running beside its own
OVERLAP_WAIT_S = 5.0
PAGES = 3


class NotOverlapped(Exception):
    pass


@dataclass
class Overlaps:
    """Events the fake nodes set and wait on."""

    second_page_asked: threading.Event = field(default_factory=threading.Event)
    source_checksums_started: threading.Event = field(default_factory=threading.Event)
    tail_imported: bool = False


class MemoryStore:
    def __init__(self, initial: SlotMap) -> None:
        self.map, self.job = initial, None

    def slot_map(self) -> SlotMap:
        return self.map

    def save_job(self, job: ReshardJob | None) -> None:
        self.job = job  # type: ignore[assignment]

    def commit(self, expected_epoch: int, slot_map: SlotMap) -> bool:
        if self.map.epoch != expected_epoch:
            return False
        self.map = slot_map
        return True


class FakeNode:
    """Answers every reshard call; ``shard`` tells source from target in each batch."""

    def __init__(self, overlaps: Overlaps, role: str) -> None:
        self.overlaps, self.role = overlaps, role

    def call(self, rpc: Rpc[Any], *, timeout: float | None = None) -> Any:
        request = rpc.request
        if rpc.method == "MigrateRows":
            if request.changes:
                return ps_pb2.MigrationRows()
            if request.offset == 1:
                self.overlaps.second_page_asked.set()
            following = request.offset + 1 if request.offset + 1 < PAGES else 0
            return ps_pb2.MigrationRows(next_offset=following)
        if rpc.method == "MigrateImport":
            first_page = not request.rows.tail and request.rows.next_offset == 1
            if first_page and not self.overlaps.second_page_asked.wait(OVERLAP_WAIT_S):
                raise NotOverlapped("the next page was not read while this one was written")
            if request.rows.tail:
                if not self.overlaps.source_checksums_started.wait(OVERLAP_WAIT_S):
                    raise NotOverlapped("the source's checksums did not run beside the tail")
                self.overlaps.tail_imported = True
            return None if request.with_checksums else 0  # a node that sends no checksums
        if rpc.method == "SealSlots":
            return ps_pb2.MigrationRows(tail=True)
        if rpc.method == "GetTableStats":  # the capacity check before the move: no spec
            return TableStats("t", 0, 0, 0, "float32", 1, None, 0, 1, None)
        if rpc.method == "SlotChecksums":
            if self.role == "source":
                self.overlaps.source_checksums_started.set()
            else:  # a target that sent none with the tail is asked once it is imported
                assert self.overlaps.tail_imported
            slots = np.arange(1, dtype=np.int64)
            return Checksums(slots, np.zeros(1, np.int64), np.zeros(1, np.uint64))
        if rpc.method == "SetSlotMap":
            return None if request.checksum_slots else True
        return {"MigrateBegin": 0, "MigrateCleanup": 0, "MigrateAbort": True}[rpc.method]


def test_snapshot_pages_are_pipelined_and_the_source_hashes_while_the_tail_is_imported() -> None:
    overlaps = Overlaps()
    initial = SlotMap.initial(1)
    job = ReshardJob.start("t", initial, 2, 1 << 14)  # one batch: shard 0 -> shard 1
    assert len(job.batches) == 1
    store = MemoryStore(initial)
    clients = [FakeNode(overlaps, "source"), FakeNode(overlaps, "target")]
    done = ReshardRun("t", clients, store).run(job)  # type: ignore[arg-type]
    assert done.phase == Phase.done
    assert store.map.epoch == initial.epoch + 1


def test_at_once_returns_in_order_and_raises_after_all_finished() -> None:
    from recstore.core.reshard.protocol import at_once

    finished = threading.Event()

    def slow() -> int:
        finished.wait(OVERLAP_WAIT_S)
        return 2

    def failing() -> int:
        finished.set()
        raise ValueError("node said no")

    try:
        at_once(slow, failing)  # slow returns only once failing has run beside it
    except ValueError as error:
        assert "node said no" in str(error)
    else:
        raise AssertionError("the error was not raised")
    assert at_once(slow, lambda: 1) == [2, 1]
