"""A node's part of a reshard, in process: tracker, seal, commit, refusals.

Requests run on threads and synchronise on events; nothing waits on a clock
except the seal's own drain deadline, which is what is tested there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from recstore.core import InvalidArgument, SlotMap, WrongShard, slot_of
from recstore.core.errors import ReshardConflict, SealTimeout, SlotMapConflict
from recstore.core.request_id import DIGEST_BYTES, Named, RequestId
from recstore.core.reshard.messages import RowBatch
from recstore.core.reshard.plan import SlotBatch, moved
from recstore.ps.changes import ChangeTracker
from recstore.ps.node import Node
from recstore.ps.reshard import slots as reshard_slots
from recstore.ps.reshard import steps as reshard_steps

from .conftest import spec

DIM = 4
KEYS = np.arange(2000, dtype=np.int64)


def _ones(n: int) -> bytes:
    return np.ones((n, DIM), np.float32).tobytes()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node, SlotBatch]]:
    """Shard 0 of 2 (the source) and shard 1 of 2 (the target) of one table."""
    table = spec("t", num_embeddings=len(KEYS), embedding_dim=DIM, shards=2,
                 optimizer={"kind": "adagrad", "lr": 0.1})  # fmt: skip
    nodes = [Node(tmp_path / f"n{i}", shard_index=i, num_shards=2) for i in range(2)]
    for node in nodes:
        node.create_table(table, SlotMap.initial(2))
    mine = KEYS[SlotMap.initial(2).shard_of(KEYS) == 0]
    nodes[0].update("t", mine.tobytes(), _ones(len(mine)), "float32", DIM, None)
    batch = SlotBatch(0, 1, ((0, 1000),))
    yield nodes[0], nodes[1], batch


def _rows(keys: np.ndarray) -> RowBatch:
    n = len(keys)
    state = np.zeros((n, DIM), np.float32)
    return RowBatch(keys, np.zeros((n, DIM), np.float32), state, np.empty(0, np.int64))


def _in_batch(batch: SlotBatch) -> np.ndarray:
    return KEYS[batch.mask()[slot_of(KEYS)]]


def test_tracker_records_only_its_slots_and_drains_once() -> None:
    mask = np.zeros(16384, bool)
    mask[:100] = True
    tracker = ChangeTracker(mask)
    keys = np.arange(5000, dtype=np.int64)
    tracker.record(keys)
    tracker.record(keys[:10])
    drained = tracker.drain()
    assert (mask[slot_of(drained)]).all() and len(drained) == len(np.unique(drained))
    assert set(drained) == set(keys[mask[slot_of(keys)]])
    assert len(tracker.drain()) == 0 and tracker.pending == 0


def test_a_held_write_is_refused_after_the_commit_and_never_applied(pair) -> None:  # type: ignore[no-untyped-def]
    source, target, batch = pair
    reshard_steps.begin_import(target, "t", list(batch.ranges))
    reshard_steps.begin_outgoing(source, "t", list(batch.ranges), batch.target)
    reshard_steps.seal(source, "t", timeout=5)
    key = _in_batch(batch)[:1]
    before = source.get("t").table.export_keys(key)
    outcome: list[BaseException | None] = []
    entered = threading.Event()

    def write() -> None:
        entered.set()
        try:
            source.update("t", key.tobytes(), _ones(1), "float32", DIM, None)
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    writer = threading.Thread(target=write)
    writer.start()
    entered.wait()
    committed = moved(SlotMap.initial(2), batch)
    assert reshard_steps.set_slot_map(target, "t", 1, committed)
    assert reshard_steps.set_slot_map(source, "t", 1, committed)  # releases the held write
    writer.join()
    assert isinstance(outcome[0], WrongShard) and outcome[0].epoch == 2
    np.testing.assert_array_equal(source.get("t").table.export_keys(key).values, before.values)
    assert not reshard_steps.set_slot_map(source, "t", 1, committed)  # a resent commit


def test_seal_deadline_unseals_when_a_request_does_not_finish(pair) -> None:  # type: ignore[no-untyped-def]
    source, _, batch = pair
    reshard_steps.begin_outgoing(source, "t", list(batch.ranges), batch.target)
    release = threading.Event()
    inside = threading.Event()

    def slow_request() -> None:
        with source.reshards.admitted("t", _in_batch(batch)[:1], 1):
            inside.set()
            release.wait()

    runner = threading.Thread(target=slow_request)
    runner.start()
    inside.wait()
    with pytest.raises(SealTimeout, match="1 requests still running"):
        reshard_steps.seal(source, "t", timeout=0.05)
    assert not source.reshards.outgoing_of("t").sealed
    release.set()
    runner.join()
    source.update("t", _in_batch(batch)[:1].tobytes(), _ones(1), "float32", DIM, None)


def test_bad_steps_are_refused_and_change_nothing(pair) -> None:  # type: ignore[no-untyped-def]
    source, target, batch = pair
    with pytest.raises(ReshardConflict, match="does not own"):
        reshard_steps.begin_outgoing(source, "t", [(9000, 9100)], 1)
    with pytest.raises(InvalidArgument, match="not within"):
        reshard_steps.begin_outgoing(source, "t", [(0, 20000)], 1)
    with pytest.raises(ReshardConflict, match="already owns"):
        reshard_steps.begin_import(source, "t", list(batch.ranges))
    with pytest.raises(ReshardConflict, match="not importing"):
        reshard_steps.import_rows(target, "t", _rows(np.empty(0, np.int64)))
    reshard_steps.begin_import(target, "t", list(batch.ranges))
    outside = KEYS[~batch.mask()[slot_of(KEYS)]][:3]
    rows = _rows(outside)
    size = target.get("t").table.size
    with pytest.raises(InvalidArgument, match="outside the importing slots"):
        reshard_steps.import_rows(target, "t", rows)
    assert target.get("t").table.size == size
    with pytest.raises(SlotMapConflict, match="must follow"):
        reshard_steps.set_slot_map(target, "t", 5, moved(SlotMap.initial(2), batch))
    assert target.get("t").entry.slot_map == SlotMap.initial(2)


def test_the_dedup_window_moves_with_the_slots(pair) -> None:  # type: ignore[no-untyped-def]
    """An update applied on the source before the move, resent to the new owner after
    it, is answered from the window there instead of being applied twice."""
    source, target, batch = pair
    key = _in_batch(batch)[:1]
    named = Named(RequestId("trainer-a", 7), b"d" * DIGEST_BYTES, b"", ())
    source.update("t", key.tobytes(), _ones(1), "float32", DIM, None, named)
    reshard_steps.begin_import(target, "t", list(batch.ranges))
    reshard_steps.begin_outgoing(source, "t", list(batch.ranges), batch.target)
    reshard_steps.import_rows(target, "t", reshard_steps.snapshot_page(source, "t", 0, 0))
    tail = reshard_steps.seal(source, "t", timeout=5)
    assert tail.dedup_entry_count == 1
    reshard_steps.import_rows(target, "t", tail)
    committed = moved(SlotMap.initial(2), batch)
    reshard_steps.set_slot_map(target, "t", 1, committed)
    reshard_steps.set_slot_map(source, "t", 1, committed)
    before = target.get("t").table.export_keys(key).values.copy()
    ack = target.update("t", key.tobytes(), _ones(1), "float32", DIM, None, named)  # the resend
    assert ack.rows == 1
    np.testing.assert_array_equal(target.get("t").table.export_keys(key).values, before)


def _named(client: str, seq: int) -> Named:
    return Named(RequestId(client, seq), b"d" * DIGEST_BYTES, b"", ())


def test_catch_up_rounds_carry_the_dedup_window_and_the_tail_only_the_rest(pair) -> None:  # type: ignore[no-untyped-def]
    """Most of the window travels before the seal; every entry still reaches the target
    once the tail is in, and a resent begin sends all of them again."""
    source, target, batch = pair
    keys = _in_batch(batch)[:3]
    outside = KEYS[~batch.mask()[slot_of(KEYS)] & (SlotMap.initial(2).shard_of(KEYS) == 0)][:1]
    source.update("t", keys[:1].tobytes(), _ones(1), "float32", DIM, None, _named("a", 1))
    source.update("t", outside.tobytes(), _ones(1), "float32", DIM, None, _named("a", 2))
    reshard_steps.begin_import(target, "t", list(batch.ranges))
    reshard_steps.begin_outgoing(source, "t", list(batch.ranges), batch.target)
    reshard_steps.import_rows(target, "t", reshard_steps.snapshot_page(source, "t", 0, 0))
    first = reshard_steps.catch_up(source, "t")
    assert first.dedup_entry_count == 1  # seq 1; seq 2 touched no moving slot
    reshard_steps.import_rows(target, "t", first)
    assert reshard_steps.catch_up(source, "t").dedup_entry_count == 0  # nothing new
    source.update("t", keys[1:2].tobytes(), _ones(1), "float32", DIM, None, _named("a", 3))
    reshard_steps.begin_outgoing(source, "t", list(batch.ranges), batch.target)  # resent
    again = reshard_steps.catch_up(source, "t")
    assert again.dedup_entry_count == 2  # seq 1 and 3: the resent begin starts over
    reshard_steps.import_rows(target, "t", again)
    source.update("t", keys[2:3].tobytes(), _ones(1), "float32", DIM, None, _named("b", 1))
    tail = reshard_steps.seal(source, "t", timeout=5)
    assert tail.dedup_entry_count == 1  # only b/1 is left for the pause
    reshard_steps.import_rows(target, "t", tail)
    held = {(e.request_id.client, e.request_id.seq) for e in target.get("t").window.entries()}
    assert held == {("a", 1), ("a", 3), ("b", 1)}


@pytest.mark.parametrize(
    ("resident", "present", "extra"),
    [
        ([], [], []),
        ([3, 1, 2], [2, 3, 1], []),  # the same keys in another order
        ([3, 1, 2], [2, 3], [1]),  # one more here
        ([3, 1, 2], [2, 3, 4], [1]),  # as many, not the same
        ([3, 1], [3, 3, 1], []),  # repeats in present
        ([5], [], [5]),
    ],
)
def test_keys_not_in_finds_the_resident_keys_the_tail_does_not_list(
    resident: list[int], present: list[int], extra: list[int]
) -> None:
    got = reshard_slots.keys_not_in(np.array(resident, np.int64), np.array(present, np.int64))
    assert sorted(got.tolist()) == extra


def test_the_tail_drops_target_rows_the_source_no_longer_has(pair) -> None:  # type: ignore[no-untyped-def]
    """Keys the tail does not list go from the target, even when nothing told it they
    went (the rows erased under the node here, so no tracker saw it)."""
    source, target, batch = pair
    keys = _in_batch(batch)
    reshard_steps.begin_import(target, "t", list(batch.ranges))
    reshard_steps.begin_outgoing(source, "t", list(batch.ranges), batch.target)
    reshard_steps.import_rows(target, "t", reshard_steps.snapshot_page(source, "t", 0, 0))
    assert source.get("t").table.erase(keys[:1]) == 1
    assert target.get("t").table.erase(keys[1:2]) == 1  # as many rows on each, not the same
    tail = reshard_steps.seal(source, "t", timeout=5)
    reshard_steps.import_rows(target, "t", tail)
    resident = target.get("t").table.keys_in_slots(batch.mask())
    assert keys[0] not in resident and keys[1] not in resident
    assert len(resident) == len(keys) - 2


def test_a_large_window_goes_in_pages_each_entry_once_with_the_moving_slots_only(
    pair, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A trainer's requests each touch thousands of slots: the window's entries travel in
    bounded pages (``next_offset`` 1 while some are left, in the tail too), each entry
    once, carrying only the slots that move."""
    source, target, batch = pair
    monkeypatch.setattr(reshard_steps, "WINDOW_PAGE_BYTES", 200)  # a few entries a page
    moving, mine = _in_batch(batch), KEYS[SlotMap.initial(2).shard_of(KEYS) == 0]
    staying = mine[~batch.mask()[slot_of(mine)]]
    for seq in range(1, 8):  # each touches moving and staying slots
        keys = np.concatenate((moving[seq : seq + 3], staying[seq : seq + 3]))
        source.update("t", keys.tobytes(), _ones(len(keys)), "float32", DIM, None, _named("a", seq))
    reshard_steps.begin_import(target, "t", list(batch.ranges))
    reshard_steps.begin_outgoing(source, "t", list(batch.ranges), batch.target)
    reshard_steps.import_rows(target, "t", reshard_steps.snapshot_page(source, "t", 0, 0))
    counts, sizes = [], []
    page = reshard_steps.catch_up(source, "t")
    counts.append(page.dedup_entry_count)
    sizes.append(len(page.dedup_entries))
    reshard_steps.import_rows(target, "t", page)
    assert page.next_offset == 1 and 0 < page.dedup_entry_count < 7
    for seq in (8, 9, 10, 11):  # more while pages are pending: some left for the tail
        keys = moving[seq : seq + 3]
        source.update("t", keys.tobytes(), _ones(3), "float32", DIM, None, _named("a", seq))
    tail = reshard_steps.seal(source, "t", timeout=5)
    counts.append(tail.dedup_entry_count)
    sizes.append(len(tail.dedup_entries))
    reshard_steps.import_rows(target, "t", tail)
    assert tail.next_offset == 1  # the rest follows through catch_up, still sealed
    rest = tail
    while rest.next_offset:
        rest = reshard_steps.catch_up(source, "t")
        counts.append(rest.dedup_entry_count)
        sizes.append(len(rest.dedup_entries))
        reshard_steps.import_rows(target, "t", rest)
    assert sum(counts) == 11 and len(counts) >= 3  # each entry once, over several pages
    assert max(sizes) <= 200
    held = {e.request_id.seq: e.slots for e in target.get("t").window.entries()}
    assert sorted(held) == list(range(1, 12))
    for slots in held.values():
        assert len(slots) and batch.mask()[slots].all()  # the moving slots only
