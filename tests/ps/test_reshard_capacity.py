"""Online shrinks into kept nodes sized for their start-up share: the target grows first.

A node sizes a table for its share of the shard count it started with; a
shrink (4 -> 1, 3 -> 1) hands the kept nodes every row. The target grows its
table to what it will own before importing, records that size, and a
restarted node (started with the old shard count) creates the table that
large again before replaying its log or loading a checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from recstore.core import SlotMap
from recstore.core.control import Rpc
from recstore.core.reshard.capacity import peak_slots
from recstore.core.reshard.plan import Phase, ReshardJob
from recstore.core.routing import NUM_SLOTS
from recstore.core.shard_rows import rows_for_slots, shard_layout
from recstore.ps.serve.server import start_in_thread
from recstore.v1 import ps_pb2

from .conftest import spec
from .test_reshard_online import PULLED, ROWS, Fleet, Trainer


def _stats(fleet: Fleet, shard: int) -> ps_pb2.TableStats:
    request = ps_pb2.GetTableStatsRequest(table=fleet.spec.name)
    return fleet.clients[shard].call(Rpc("GetTableStats", request, lambda r: r))


def _train_everything(fleet: Fleet) -> Trainer:
    """Every row resident: rows of the trained half updated by unique deltas, the rest pulled."""
    trainer = Trainer(fleet.endpoints, fleet.spec.name)
    rng = np.random.default_rng(3)
    for _ in range(40):
        trainer.step(rng)
    trainer.client.pull(fleet.spec.name, torch.arange(ROWS))
    return trainer


def _move(fleet: Fleet, shards: int) -> ReshardJob:
    job = ReshardJob.start(fleet.spec.name, fleet.store.slot_map(), shards, batch_slots=2048)
    return fleet.run(shards).run(job)


def _check_rows(fleet: Fleet, trainer: Trainer) -> None:
    trainer.check()  # exact sums of the acknowledged deltas
    zeros = trainer.client.pull(fleet.spec.name, torch.from_numpy(PULLED)).numpy()
    np.testing.assert_array_equal(zeros, np.zeros_like(zeros))


@pytest.mark.parametrize("start", [4, 3])
def test_shrink_to_one_with_every_row_resident_finishes(tmp_path: Path, start: int) -> None:
    fleet = Fleet(tmp_path, start, start)
    try:
        trainer = _train_everything(fleet)
        before = _stats(fleet, 0).capacity
        assert before == shard_layout(fleet.spec, 0, start).capacity < ROWS
        job = _move(fleet, 1)
        assert job.phase == Phase.done and fleet.store.slot_map().num_shards == 1
        stats = _stats(fleet, 0)
        assert stats.size == ROWS
        # grown to what it owns now, not beyond the table's ids
        assert stats.capacity == rows_for_slots(fleet.spec, NUM_SLOTS) == ROWS
        for shard in range(1, start):  # emptied and cleaned up, not grown
            assert _stats(fleet, shard).size == 0
            assert _stats(fleet, shard).capacity == before
        _check_rows(fleet, trainer)
    finally:
        fleet.stop()


def test_a_partial_shrink_grows_each_target_only_to_the_slots_it_holds(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, 4, 4)
    try:
        trainer = _train_everything(fleet)
        plan = ReshardJob.start(fleet.spec.name, SlotMap.initial(4), 2)
        _move(fleet, 2)
        for shard in (0, 1):  # what it owned and received (kept until each cleanup)
            peak = peak_slots(SlotMap.initial(4), plan, shard)
            assert _stats(fleet, shard).capacity == rows_for_slots(fleet.spec, peak) < ROWS
        _check_rows(fleet, trainer)
    finally:
        fleet.stop()


@pytest.mark.parametrize("durability", ["wal", "checkpoint"])
def test_a_grown_node_restarted_with_its_old_size_keeps_the_capacity(
    tmp_path: Path, durability: str
) -> None:
    fleet = Fleet(tmp_path, 4, 4, durability=durability)
    try:
        trainer = _train_everything(fleet)
        _move(fleet, 1)
        grown = _stats(fleet, 0).capacity
        if durability == "checkpoint":
            fleet.clients[0].call(Rpc("Save", ps_pb2.SaveRequest(), lambda r: r))
        handle = fleet.handles[0]
        port = handle.port
        handle.stop()
        # started as before the move: shard 0 of 4, whose start-up share is a quarter
        fleet.handles[0] = start_in_thread(
            port=port, data_dir=tmp_path / "node-0", shard_index=0, num_shards=4,
            durability=durability,
        )  # fmt: skip
        stats = _stats(fleet, 0)
        assert stats.capacity == grown and stats.size == ROWS
        assert fleet.store.slot_map() != SlotMap.initial(4)
        _check_rows(fleet, trainer)
        trainer.step(np.random.default_rng(9))  # still writable after the restart
        trainer.check()
    finally:
        fleet.stop()


def test_rows_for_slots_is_the_start_up_share_for_an_initial_range() -> None:
    table = spec("sized", num_embeddings=ROWS, shards=4)
    assert rows_for_slots(table, NUM_SLOTS // 4) == shard_layout(table, 0, 4).capacity
    assert rows_for_slots(table, 0) == 64
    hashed = spec("keys", keys={"mode": "hashed", "capacity": 1000}, shards=4)
    assert rows_for_slots(hashed, NUM_SLOTS // 2) == 500


def test_a_client_created_after_a_grow_accepts_nodes_in_shard_order(tmp_path: Path) -> None:
    # the kept nodes started as shards of 2, the added one as shard 2 of 3
    fleet = Fleet(tmp_path, 3, 2)
    try:
        _move(fleet, 3)
        assert fleet.store.slot_map().num_shards == 3
        joined = Trainer(fleet.endpoints, fleet.spec.name)  # a trainer started after the move
        joined.step(np.random.default_rng(1))
        joined.check()
        with pytest.raises(RuntimeError, match="shard order"):
            Trainer(fleet.endpoints[::-1], fleet.spec.name)
        with pytest.raises(RuntimeError, match="spreads the table over 3 shards"):
            Trainer(fleet.endpoints[:2], fleet.spec.name)  # a shard left out
    finally:
        fleet.stop()
