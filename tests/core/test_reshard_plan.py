"""The reshard planner and job record (recstore.core.reshard.plan), table-tested."""

from __future__ import annotations

import pytest

from recstore.core import NUM_SLOTS, SlotMap
from recstore.core.reshard.plan import (
    BATCH_KEYS,
    Phase,
    ReshardJob,
    ResumeAction,
    moved,
    plan_batches,
    resume_action,
    sized_batch_slots,
    target_map,
)


def _apply_all(slot_map: SlotMap, shards: int, batch_slots: int = 1024) -> SlotMap:
    for batch in plan_batches(slot_map, shards, batch_slots):
        slot_map = moved(slot_map, batch)
    return slot_map


@pytest.mark.parametrize(("n", "m"), [(1, 2), (2, 3), (1, 4), (2, 4), (1, 3)])
def test_grow_then_shrink_moves_only_the_slots_that_change_owner(n: int, m: int) -> None:
    """N -> M -> N moves about |M-N|/max(M,N) of the slots each way, ending on equal ranges."""
    start = SlotMap.initial(n)
    bound = abs(m - n) / max(m, n) * NUM_SLOTS + m  # + rounding of the ranges
    grown = _apply_all(start, m)
    assert sum(b.slots for b in plan_batches(start, m)) <= bound
    assert sum(b.slots for b in plan_batches(grown, n)) <= bound
    for before, after, shards in ((start, grown, m), (grown, _apply_all(grown, n), n)):
        assert after.num_shards == shards
        assert after.epoch == before.epoch + len(plan_batches(before, shards))
        goal = [(r.start, r.end) for r in SlotMap.initial(shards).ranges]
        assert sorted((r.start, r.end) for r in after.ranges) == goal


@pytest.mark.parametrize(
    ("n", "m", "moved"), [(3, 2, 8191), (3, 4, 5461), (4, 2, 12288), (4, 3, 9557), (2, 1, 8192)]
)
def test_shrink_of_an_initial_map_moves_what_equal_ranges_need(n: int, m: int, moved: int) -> None:
    """From initial(N) the M equal ranges leave no cheaper choice (each range keeps its
    largest current owner among the surviving shards)."""
    start = SlotMap.initial(n)
    assert sum(b.slots for b in plan_batches(start, m)) == moved
    assert _apply_all(start, m).num_shards == m


@pytest.mark.parametrize(("n", "m"), [(2, 3), (3, 2), (4, 2), (1, 3)])
def test_each_batch_is_one_pair_within_the_limit(n: int, m: int) -> None:
    start = SlotMap.initial(n)
    owners = start.owner_table()
    for batch in plan_batches(start, m, batch_slots=500):
        assert 0 < batch.slots <= 500
        assert (owners[batch.mask()] == batch.source).all()
        assert batch.source != batch.target


def test_shrink_empties_the_highest_shard_first() -> None:
    start = SlotMap.initial(4)
    sources = [b.source for b in plan_batches(start, 2)]
    assert sources == sorted(sources, reverse=True)
    assert sources[0] == 3 and {2, 3} <= set(sources)


def test_there_and_back_restores_the_ranges() -> None:
    grown = _apply_all(SlotMap.initial(2), 3)
    back = _apply_all(grown, 2)
    assert [(r.start, r.end, r.shard) for r in back.ranges] == [
        (r.start, r.end, r.shard) for r in SlotMap.initial(2).ranges
    ]


def test_same_count_plans_nothing() -> None:
    assert plan_batches(SlotMap.initial(3), 3) == []
    assert ReshardJob.start("t", SlotMap.initial(3), 3).phase == Phase.done
    assert target_map(SlotMap.initial(3), 3).ranges == SlotMap.initial(3).ranges


def test_bad_batch_size_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_slots"):
        plan_batches(SlotMap.initial(2), 3, batch_slots=0)


def test_job_record_round_trips_and_counts_progress() -> None:
    job = ReshardJob.start("t", SlotMap.initial(2), 3, batch_slots=2000)
    assert job.slots_moved == 0 and job.slots_total == sum(b.slots for b in job.batches)
    assert ReshardJob.from_dict(job.to_dict()) == job
    job = job.at(Phase.sealed)
    job = job.next_batch(epoch=job.base_epoch + 1, batch_bytes=100)
    assert job.current == 1 and job.phase == Phase.copying and job.bytes_moved == 100
    assert job.slots_moved == job.batches[0].slots
    assert ReshardJob.from_dict(job.to_dict()) == job
    while job.phase != Phase.done:
        job = job.next_batch(job.base_epoch + 1, 0)
    assert job.slots_moved == job.slots_total


@pytest.mark.parametrize(
    ("phase", "epoch_delta", "action"),
    [
        (Phase.copying, 0, ResumeAction.abort),
        (Phase.sealed, 0, ResumeAction.abort),
        (Phase.sealed, 1, ResumeAction.finish),
        (Phase.committed, 1, ResumeAction.finish),
    ],
)
def test_restart_finishes_a_committed_batch_else_aborts(
    phase: Phase, epoch_delta: int, action: ResumeAction
) -> None:
    job = ReshardJob.start("t", SlotMap.initial(2), 3).at(phase)
    assert resume_action(job, job.base_epoch + epoch_delta) == action


def test_restart_refuses_a_map_the_job_does_not_explain() -> None:
    job = ReshardJob.start("t", SlotMap.initial(2), 3)
    with pytest.raises(ValueError, match="disagree"):
        resume_action(job, job.base_epoch + 5)
    assert resume_action(job.at(Phase.done), 99) == ResumeAction.none


@pytest.mark.parametrize(
    ("rows_per_slot", "wanted", "slots"),
    [
        (0.0, 1024, 1024),  # unknown: as asked
        (122.0, 1024, 1024),  # 2M rows over 2 shards: the default holds
        (610.4, 1024, 429),  # 10M rows over 2 shards
        (61_035.0, 1024, 4),  # 1e9 rows over 2 shards
        (1e7, 1024, 1),  # never none
        (10.0, 256, 256),  # a smaller wish stands
    ],
)
def test_batches_hold_at_most_about_batch_keys_rows(
    rows_per_slot: float, wanted: int, slots: int
) -> None:
    assert sized_batch_slots(rows_per_slot, wanted) == slots
    assert slots == 1 or slots == wanted or slots * rows_per_slot <= BATCH_KEYS
