"""A batch's checksums travel in the replies of the calls its write pause makes anyway.

The last tail import's reply carries the target's checksums, and the target's
SetSlotMap the target's at the install, taken in the same hold of the table;
the target keeps both as rows arrive (``recstore.ps.reshard.import_sums``) and hashes
its slots in full only when a row removal it did not make may have changed
them. The
source hashes its sealed slots in a SlotChecksums call that runs beside the
tail's import; a seal can also return them in its reply (``with_checksums``).
Checked on one node pair in process and on a fleet on loopback with a trainer
running.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recstore.core import SlotMap, WrongShard, slot_of
from recstore.core.control import ControlClient, Rpc
from recstore.core.reshard.messages import checksums_in, rows_from_proto, rows_to_proto
from recstore.core.reshard.plan import ReshardJob, SlotBatch, moved
from recstore.ps import native_path
from recstore.ps.node import Node
from recstore.ps.reshard import import_sums
from recstore.ps.reshard import slots as reshard_slots
from recstore.ps.reshard import steps as reshard_steps
from recstore.v1 import ps_pb2

from .conftest import spec
from .test_reshard_online import Fleet, Trainer

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


def _begin_move(source: Node, target: Node, batch: SlotBatch) -> list[tuple[int, int]]:
    ranges = list(batch.ranges)
    reshard_steps.begin_import(target, "t", ranges)
    reshard_steps.begin_outgoing(source, "t", ranges, batch.target)
    return ranges


def _copy_and_seal(source: Node, target: Node, batch: SlotBatch) -> Any:
    _begin_move(source, target, batch)
    offset = 0
    while True:
        page = reshard_steps.snapshot_page(source, "t", offset, 500)
        reshard_steps.import_rows(target, "t", page)
        if not page.next_offset:
            break
        offset = page.next_offset
    tail = reshard_steps.seal(source, "t", timeout=5, with_checksums=True)
    reshard_steps.import_rows(target, "t", tail)
    return tail


def test_seal_import_and_install_return_the_checksums_of_the_batch(pair) -> None:  # type: ignore[no-untyped-def]
    source, target, batch = pair
    tail = _copy_and_seal(source, target, batch)
    sealed = tail.checksums
    assert sealed is not None and sealed.rows.sum() > 0
    assert not sealed.differing(reshard_steps.checksums(source, "t", list(batch.ranges)))
    assert not sealed.differing(reshard_steps.importing_checksums(target, "t"))
    # on the wire and back, as the runner receives it
    assert not sealed.differing(rows_from_proto(rows_to_proto(tail, "float16"), "float16",
                                                DIM, 2 * DIM).checksums)  # fmt: skip

    committed = moved(SlotMap.initial(2), batch)
    installed = reshard_steps.activate(target, "t", 1, committed, list(batch.ranges))
    at_install = installed.checksums
    assert installed.changed and at_install is not None and not sealed.differing(at_install)
    assert installed.held_s == 0  # the target held nothing
    assert target.get("t").owned_slots[batch.mask()].all()
    resent = reshard_steps.activate(target, "t", 1, committed, list(batch.ranges))
    assert resent.changed is False and resent.checksums is not None
    assert not sealed.differing(resent.checksums)
    released = reshard_steps.activate(source, "t", 1, committed, None)
    assert released.changed and released.checksums is None and released.held_s > 0


def _count_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    passes = [0]
    real = reshard_slots.slot_checksums

    def counted(table: Any, slots: np.ndarray) -> Any:
        passes[0] += 1
        return real(table, slots)

    monkeypatch.setattr(reshard_slots, "slot_checksums", counted)
    return passes


def test_the_install_takes_the_running_checksums_while_nothing_removed_a_row(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target, batch = pair
    sealed = _copy_and_seal(source, target, batch).checksums
    imported = reshard_steps.importing_checksums(target, "t")
    passes = _count_passes(monkeypatch)
    committed = moved(SlotMap.initial(2), batch)
    at_install = reshard_steps.activate(target, "t", 1, committed, list(batch.ranges)).checksums
    assert at_install is not None and passes[0] == 0
    assert not sealed.differing(at_install) and not imported.differing(at_install)
    # installed: the slots are the target's now, so a resent install hashes them again
    resent = reshard_steps.activate(target, "t", 1, committed, list(batch.ranges)).checksums
    assert resent is not None and passes[0] == 1 and not sealed.differing(resent)


def test_a_row_removed_after_the_import_makes_the_install_hash_again(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target, batch = pair
    sealed = _copy_and_seal(source, target, batch).checksums
    reshard_steps.importing_checksums(target, "t")
    table = target.get("t").table
    assert table.erase(table.keys_in_slots(batch.mask())[:1]) == 1  # as an eviction would
    passes = _count_passes(monkeypatch)
    committed = moved(SlotMap.initial(2), batch)
    at_install = reshard_steps.activate(target, "t", 1, committed, list(batch.ranges)).checksums
    assert at_install is not None and passes[0] == 1
    assert len(sealed.differing(at_install)) == 1


def test_an_import_after_the_checksums_is_in_the_installs(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target, batch = pair
    tail = _copy_and_seal(source, target, batch)
    reshard_steps.importing_checksums(target, "t")
    key = tail.keys[:1] if len(tail.keys) else KEYS[batch.mask()[slot_of(KEYS)]][:1]
    chunk = source.get("t").table.export_keys(key)
    resent = dataclasses.replace(tail, keys=chunk.keys, values=chunk.values,
                                 state=chunk.state * 2 + 1, present=None)  # fmt: skip
    reshard_steps.import_rows(target, "t", resent)  # one row's state changed
    passes = _count_passes(monkeypatch)
    committed = moved(SlotMap.initial(2), batch)
    at_install = reshard_steps.activate(target, "t", 1, committed, list(batch.ranges)).checksums
    assert at_install is not None and passes[0] == 0
    assert len(tail.checksums.differing(at_install)) == 1


def test_a_table_whose_rows_expire_by_time_always_hashes_at_the_install(tmp_path: Path) -> None:
    table = spec("t", num_embeddings=100, embedding_dim=DIM, shards=2,
                 keys={"mode": "hashed", "ttl_seconds": 3600})  # fmt: skip
    node = Node(tmp_path / "n", shard_index=0, num_shards=2)
    node.create_table(table, SlotMap.initial(2))
    assert import_sums.removal_counts(node.get("t").table) is None
    untimed = Node(tmp_path / "m", shard_index=0, num_shards=2)
    untimed.create_table(spec("u", num_embeddings=100, embedding_dim=DIM, shards=2),
                         SlotMap.initial(2))  # fmt: skip
    assert import_sums.removal_counts(untimed.get("u").table) == (0, 0, 0)


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


def test_a_move_asks_only_the_source_for_its_checksums(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, 3, 2)
    try:
        trainer = Trainer(fleet.endpoints, fleet.spec.name)
        trainer.thread.start()
        calls: dict[str, int] = {}
        counted = [Counting(c, calls) for c in fleet.clients]
        run = fleet.run(3)
        run.clients = counted  # type: ignore[assignment]
        job = ReshardJob.start(fleet.spec.name, fleet.store.slot_map(), 3, batch_slots=2000)
        done = run.run(job)
        trainer.finish()
        assert len(run.records) == len(done.batches) > 1
        # the source's, beside each tail's import; the target's came in replies
        assert calls["SlotChecksums"] == len(done.batches)
        for record in run.records:
            assert record.seal_checksums.rows.sum() > 0
            assert not record.seal_checksums.differing(record.activation_checksums)
        trainer.check()
    finally:
        fleet.stop()


def test_the_target_keeps_its_checksums_as_rows_arrive(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snapshot pages, changed rows, keys gone and keys left from an earlier try: the
    running sums equal a full pass at the tail, and the tail's checksums take none."""
    source, target, batch = pair
    keys = KEYS[batch.mask()[slot_of(KEYS)]]
    target.get("t").table.import_chunk(  # left by an earlier try, unknown to the source
        *_rows_of(source, keys[:2])
    )
    ranges = _begin_move(source, target, batch)
    reshard_steps.import_rows(target, "t", reshard_steps.snapshot_page(source, "t", 0, 0))
    grads = np.ones((3, DIM), np.float32).tobytes()
    source.update("t", keys[3:6].tobytes(), grads, "float32", DIM, None)
    reshard_steps.import_rows(target, "t", reshard_steps.catch_up(source, "t"))
    assert source.get("t").table.erase(keys[6:7]) == 1  # gone, and no tracker saw it
    assert source.get("t").table.erase(keys[7:8]) == 1
    source.reshards.record("t", keys[7:8])  # gone, and tracked (as an eviction is)
    passes = _count_passes(monkeypatch)
    tail = reshard_steps.seal(source, "t", timeout=5)
    reshard_steps.import_rows(target, "t", tail)
    kept = reshard_steps.importing_checksums(target, "t")
    assert passes[0] == 0
    full = reshard_steps.checksums(target, "t", ranges)
    assert passes[0] == 1 and not kept.differing(full)
    assert not kept.differing(reshard_steps.checksums(source, "t", ranges))


def test_a_row_removed_during_the_import_makes_the_tail_hash_in_full(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target, batch = pair
    ranges = _begin_move(source, target, batch)
    reshard_steps.import_rows(target, "t", reshard_steps.snapshot_page(source, "t", 0, 0))
    table = target.get("t").table
    assert table.erase(table.keys_in_slots(batch.mask())[:1]) == 1  # as an eviction would
    passes = _count_passes(monkeypatch)
    sums = reshard_steps.importing_checksums(target, "t")
    assert passes[0] == 1
    assert len(sums.differing(reshard_steps.checksums(source, "t", ranges))) == 1


def _rows_of(node: Node, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    chunk = node.get("t").table.export_keys(keys)
    return chunk.keys, chunk.values, chunk.state


def test_an_import_that_fails_halfway_drops_the_running_sums(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target, batch = pair
    _begin_move(source, target, batch)
    page = reshard_steps.snapshot_page(source, "t", 0, 0)
    table = target.get("t").table
    real = table.import_chunk

    def half(keys: np.ndarray, values: np.ndarray, state: np.ndarray) -> None:
        real(keys[:1], values[:1], state[:1])  # one row written, then the engine fails
        raise MemoryError("out of memory")

    monkeypatch.setattr(table, "import_chunk", half)
    with pytest.raises(MemoryError):
        reshard_steps.import_rows(target, "t", page)
    monkeypatch.setattr(table, "import_chunk", real)
    passes = _count_passes(monkeypatch)
    sums = reshard_steps.importing_checksums(target, "t")
    assert passes[0] == 1  # hashed in full: the sums of half an import were dropped
    assert sums.rows.sum() == 1


def test_client_writes_to_importing_slots_are_refused_and_leave_the_sums_exact(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the running sums rest on: until the install no client writes the slots a
    target imports, on either write path."""
    source, target, batch = pair
    ranges = _begin_move(source, target, batch)
    reshard_steps.import_rows(target, "t", reshard_steps.snapshot_page(source, "t", 0, 0))
    key = KEYS[batch.mask()[slot_of(KEYS)]][:1]
    row = np.full((1, DIM), 7, np.float32).tobytes()
    with pytest.raises(WrongShard):
        target.update("t", key.tobytes(), row, "float32", DIM, None)
    with pytest.raises(WrongShard):
        target.push("t", key.tobytes(), np.full((1, DIM), 7, np.float16).tobytes(), "float16", DIM)
    request = ps_pb2.MultiUpdateRequest(items=[ps_pb2.UpdateRequest(
        table="t", epoch=1, keys=key.tobytes(), grads=row, dim=DIM)])  # fmt: skip
    with pytest.raises(WrongShard):
        native_path.serve(target, "MultiUpdate", request.SerializeToString())
    passes = _count_passes(monkeypatch)
    kept = reshard_steps.importing_checksums(target, "t")
    assert passes[0] == 0
    assert not kept.differing(reshard_steps.checksums(target, "t", ranges))
