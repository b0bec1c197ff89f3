"""Live N -> M -> N resharding for every N != M in 1..4, a trainer running through the SDK.

Real nodes on loopback with write-ahead logs, moved by the runner the
provisioners use (``recstore.core.reshard.protocol``). Every update adds a unique
integer delta through SGD with lr 1 on a zeros table, so each row must end as
minus the exact sum of its acknowledged deltas. Every log record says the
slot-map epoch its write was applied under; read back after both moves, the
logs of all nodes must show one owner per slot and epoch, epochs never going
down, no request applied twice (``recstore.ps.wal.apply_log``), and each write made
by the owner its slot had in the committed map of that epoch. The checksums of
every batch are equal at the seal and at activation. The widest pairs also run
in checkpoint durability, where the native engine applies unlogged updates.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from recstore.core import SlotMap
from recstore.core.reshard.plan import Phase, ReshardJob, moved
from recstore.core.reshard.protocol import BatchRecord
from recstore.ps.wal import apply_log

from .test_reshard_online import Fleet, Trainer

#: every ordered pair of shard counts, each test going there and back, with logs; and
#: the widest pairs in checkpoint durability (updates served by the native engine
#: where no log is appended), whose writes are checked by their sums alone
CASES = [(n, m, "wal") for n in range(1, 5) for m in range(1, 5) if n != m] + [
    (1, 4, "checkpoint"),
    (4, 1, "checkpoint"),
]
#: large batches keep the matrix short; a 1 <-> 4 move still takes several
BATCH_SLOTS = 4096
#: the rows trained: few enough that one shard sized for four holds them all (a
#: node's engine table is sized when it starts, for the shard count then)
TRAINED = np.arange(1200)


@pytest.fixture
def moving(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Fleet, int]]:
    """Nodes serving a table of N shards (as many as either count needs), and M."""
    start, to, durability = request.param
    fleet = Fleet(tmp_path, max(start, to), start, durability=durability)
    yield fleet, to
    fleet.stop()


def _maps_by_epoch(first: SlotMap, jobs: list[ReshardJob]) -> dict[int, SlotMap]:
    """The committed map of every epoch the moves went through."""
    maps = {first.epoch: first}
    current = first
    for job in jobs:
        for batch in job.batches:
            current = moved(current, batch)
            maps[current.epoch] = current
    return maps


def _logs(fleet: Fleet) -> list[apply_log.NodeLog]:
    return [
        apply_log.read(
            apply_log.table_wal_dir(h.server.config.data_dir, fleet.spec.name), str(shard)
        )
        for shard, h in enumerate(fleet.handles)
    ]


@pytest.mark.parametrize(
    "moving", CASES, indirect=True, ids=[f"{n}-{m}-{n}-{mode}" for n, m, mode in CASES]
)
def test_there_and_back_with_a_trainer_running(moving: tuple[Fleet, int]) -> None:
    fleet, to = moving
    start = fleet.store.slot_map()
    shards = start.num_shards
    trainer = Trainer(fleet.endpoints, fleet.spec.name, TRAINED)
    during = Trainer(fleet.endpoints, fleet.spec.name, TRAINED)  # writes while batches copy
    rng = np.random.default_rng(13)

    def write_while_copying(step: str, job: ReshardJob) -> None:
        if step == "catch-up":  # after the snapshot: only the change stream carries it
            during.step(rng)

    trainer.thread.start()
    jobs: list[ReshardJob] = []
    records: list[BatchRecord] = []
    for shard_count in (to, shards):
        run = fleet.run(shard_count, on_step=write_while_copying)
        job = ReshardJob.start(
            fleet.spec.name, fleet.store.slot_map(), shard_count, batch_slots=BATCH_SLOTS
        )
        jobs.append(run.run(job))
        records += run.records
    trainer.finish()

    assert all(job.phase == Phase.done and job.slots_moved == job.slots_total for job in jobs)
    maps = _maps_by_epoch(start, jobs)
    final = fleet.store.slot_map()
    assert final == maps[max(maps)] and final.num_shards == shards
    assert len(records) == sum(len(job.batches) for job in jobs) == len(maps) - 1
    for record in records:  # equal at the seal and at activation, optimizer state included
        assert not record.seal_checksums.differing(record.activation_checksums), record.batch
    assert sum(int(r.seal_checksums.rows.sum()) for r in records) > 0

    trainer.sums += during.sums
    trainer.check()

    if fleet.handles[0].server.config.durability == "wal":  # only a log says who wrote
        _check_logs(fleet, maps)


def _check_logs(fleet: Fleet, maps: dict[int, SlotMap]) -> None:
    """Every node's log: the audit passes, and each write came from its slot's owner."""
    logs = _logs(fleet)
    assert apply_log.audit(logs) == []
    assert all(log.unattributed == 0 for log in logs)
    epochs = set()
    for shard, log in enumerate(logs):
        for write in log.writes:
            owners = maps[write.epoch].owner_table()[write.slots]
            assert (owners == shard).all(), f"shard {shard} wrote slots it did not own"
            epochs.add(write.epoch)
    assert len(epochs) > 1  # writes were applied under maps the moves committed
