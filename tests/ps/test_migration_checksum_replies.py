"""A batch's checksums travel in the replies of the calls its write pause makes anyway.

The seal's reply carries the source's checksums (taken once the requests inside
had drained), the last tail import's the target's, and the target's SetSlotMap
the target's at the install, taken in the same hold of the table; so a batch
makes no SlotChecksums call of its own. Checked on one node pair in process and
on a fleet on loopback with a trainer running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recstore.core import SlotMap
from recstore.core.control import ControlClient, Rpc
from recstore.core.migration import MigrationJob, SlotBatch, moved
from recstore.core.migration_wire import checksums_in, rows_from_proto, rows_to_proto
from recstore.ps import migration_ops
from recstore.ps.node import Node
from recstore.v1 import ps_pb2

from .conftest import spec
from .test_migration_online import Fleet, Trainer

DIM = 3
KEYS = np.arange(3000, dtype=np.int64)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node, SlotBatch]]:
    table = spec("t", num_embeddings=len(KEYS), embedding_dim=DIM, shards=2,
                 dtype="float16", optimizer={"kind": "adam"})  # fmt: skip
    nodes = [Node(tmp_path / f"n{i}", shard_index=i, num_shards=2) for i in range(2)]
    for node in nodes:
        node.create_table(table, SlotMap.initial(2))
    mine = KEYS[SlotMap.initial(2).shard_of(KEYS) == 0]
    grads = np.random.default_rng(3).standard_normal((len(mine), DIM)).astype(np.float32)
    nodes[0].update("t", mine.tobytes(), grads.tobytes(), "float32", DIM, None)
    yield nodes[0], nodes[1], SlotBatch(0, 1, ((0, 1500),))


def _copy_and_seal(source: Node, target: Node, batch: SlotBatch) -> Any:
    ranges = list(batch.ranges)
    migration_ops.begin_import(target, "t", ranges)
    migration_ops.begin_outgoing(source, "t", ranges, batch.target)
    offset = 0
    while True:
        page = migration_ops.snapshot_page(source, "t", offset, 500)
        migration_ops.import_rows(target, "t", page)
        if not page.next_offset:
            break
        offset = page.next_offset
    tail = migration_ops.seal(source, "t", timeout=5, with_checksums=True)
    migration_ops.import_rows(target, "t", tail)
    return tail


def test_seal_import_and_install_return_the_checksums_of_the_batch(pair) -> None:  # type: ignore[no-untyped-def]
    source, target, batch = pair
    tail = _copy_and_seal(source, target, batch)
    sealed = tail.checksums
    assert sealed is not None and sealed.rows.sum() > 0
    assert not sealed.differing(migration_ops.checksums(source, "t", list(batch.ranges)))
    assert not sealed.differing(migration_ops.importing_checksums(target, "t"))
    # on the wire and back, as the runner receives it
    assert not sealed.differing(rows_from_proto(rows_to_proto(tail, "float16"), "float16",
                                                DIM, 2 * DIM).checksums)  # fmt: skip

    committed = moved(SlotMap.initial(2), batch)
    installed = migration_ops.activate(target, "t", 1, committed, list(batch.ranges))
    at_install = installed.checksums
    assert installed.changed and at_install is not None and not sealed.differing(at_install)
    assert installed.held_s == 0  # the target held nothing
    assert target.get("t").owned_slots[batch.mask()].all()
    resent = migration_ops.activate(target, "t", 1, committed, list(batch.ranges))
    assert resent.changed is False and resent.checksums is not None
    assert not sealed.differing(resent.checksums)
    released = migration_ops.activate(source, "t", 1, committed, None)
    assert released.changed and released.checksums is None and released.held_s > 0


def test_a_row_changed_on_the_target_before_the_install_shows_in_its_checksums(pair) -> None:  # type: ignore[no-untyped-def]
    source, target, batch = pair
    sealed = _copy_and_seal(source, target, batch).checksums
    table = target.get("t").table
    chunk = table.export_keys(table.keys_in_slots(batch.mask())[:1])
    table.import_chunk(chunk.keys, chunk.values, chunk.state * 2 + 1)  # one state word
    committed = moved(SlotMap.initial(2), batch)
    at_install = migration_ops.activate(target, "t", 1, committed, list(batch.ranges)).checksums
    assert at_install is not None and len(sealed.differing(at_install)) == 1


def test_replies_without_checksums_read_as_none() -> None:
    assert checksums_in(ps_pb2.MigrationRows()) is None
    assert checksums_in(ps_pb2.MigrateImportResponse(rows=3)) is None
    assert checksums_in(ps_pb2.SetSlotMapResponse(changed=True)) is None


class Counting:
    """A control client that counts the calls it makes, by method."""

    def __init__(self, client: ControlClient, calls: dict[str, int]) -> None:
        self.client, self.calls = client, calls

    def call(self, rpc: Rpc[Any], **kwargs: Any) -> Any:
        self.calls[rpc.method] = self.calls.get(rpc.method, 0) + 1
        return self.client.call(rpc, **kwargs)


def test_a_move_makes_no_checksum_call_of_its_own(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, 3, 2)
    try:
        trainer = Trainer(fleet.endpoints, fleet.spec.name)
        trainer.thread.start()
        calls: dict[str, int] = {}
        counted = [Counting(c, calls) for c in fleet.clients]
        run = fleet.run(3)
        run.clients = counted  # type: ignore[assignment]
        job = MigrationJob.start(fleet.spec.name, fleet.store.slot_map(), 3, batch_slots=2000)
        done = run.run(job)
        trainer.finish()
        assert "SlotChecksums" not in calls
        assert len(run.records) == len(done.batches) > 1
        for record in run.records:
            assert record.seal_checksums.rows.sum() > 0
            assert not record.seal_checksums.differing(record.activation_checksums)
        trainer.check()
    finally:
        fleet.stop()
