"""Online resharding with real nodes on loopback and a trainer running through the SDK.

Every update adds a unique integer delta through SGD with lr 1 on a zeros
table, so each row must end as minus the exact sum of its acknowledged deltas.
The move is run by ``recstore.core.reshard.protocol`` (what the provisioners run)
against nodes started in this process; a fault is a step hook that raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from recstore.client import RecStoreClient
from recstore.core import SlotMap, TableSpec
from recstore.core.control import ControlClient, ControlError, Rpc, create_table_rpc
from recstore.core.reshard.messages import checksums_rpc
from recstore.core.reshard.plan import Phase, ReshardJob
from recstore.core.reshard.protocol import ReshardRun
from recstore.local.reshard_store import FileJobStore
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2

from .conftest import spec

ROWS, DIM = 4000, 4
TRAINED = np.arange(0, ROWS // 2)  # updated by the trainer
PULLED = np.arange(ROWS // 2, ROWS)  # only pulled, while the snapshot runs


class Crash(BaseException):
    """The provisioner dies at a step: nothing after it runs, not even the abort."""


class Fleet:
    """``shards`` nodes serving a table of ``start`` shards (the others own no slot yet)."""

    def __init__(
        self, root: Path, shards: int, start: int, durability: str = "checkpoint",
        rows: int = ROWS, dim: int = DIM,
    ) -> None:  # fmt: skip
        # as a provisioner starts them: the first ones sized for the table's first shard
        # count, the added ones for the new count (a target grows its table when it must)
        self.handles: list[ServerHandle] = [
            start_in_thread(
                data_dir=root / f"node-{i}",
                shard_index=i,
                num_shards=start if i < start else shards,
                durability=durability,
            )
            for i in range(shards)
        ]
        self.endpoints = [h.address for h in self.handles]
        self.clients = [ControlClient(e, timeout=60) for e in self.endpoints]
        self.spec: TableSpec = spec(
            "moving", num_embeddings=rows, embedding_dim=dim, shards=start,
            optimizer={"kind": "sgd", "lr": 1.0}, initializer={"kind": "zeros"},
        )  # fmt: skip
        self.store = FileJobStore(root / "job.json", SlotMap.initial(start))
        for client in self.clients:
            client.call(create_table_rpc(self.spec, SlotMap.initial(start)))

    def run(self, shards: int, **hooks: object) -> ReshardRun:
        return ReshardRun(self.spec.name, self.clients, self.store, **hooks)  # type: ignore[arg-type]

    def stop(self) -> None:
        for client, handle in zip(self.clients, self.handles, strict=True):
            client.close()
            handle.stop()


class Trainer:
    """Updates random trained rows by unique integer deltas until told to stop."""

    def __init__(self, endpoints: list[str], name: str, trained: np.ndarray = TRAINED) -> None:
        self.client = RecStoreClient(role=f"trainer-{id(self)}")
        self.client.set_ps_endpoints(endpoints)
        self.client.init_data(
            name, (ROWS, DIM), torch.float32, optimizer={"kind": "sgd", "lr": 1.0}
        )
        self.name = name
        self.trained = trained
        self.sums = np.zeros(ROWS, dtype=np.int64)
        self.steps = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def step(self, rng: np.random.Generator) -> None:
        ids = rng.choice(self.trained, 64, replace=False)
        delta = self.steps + 1  # unique per update
        grads = torch.full((64, DIM), float(delta))
        self.client.update(self.name, torch.from_numpy(ids), grads, lr=1.0)
        self.client.pull(self.name, torch.from_numpy(ids[:4]))  # waits for the update
        self.sums[ids] += delta
        self.steps += 1

    def _loop(self) -> None:
        rng = np.random.default_rng(7)
        try:
            while not self.stop.is_set() or self.steps < 20:
                self.step(rng)
        except BaseException as error:  # the test reports it
            self.error = error

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=120)
        assert self.error is None, self.error

    def check(self) -> None:
        got = self.client.pull(self.name, torch.from_numpy(self.trained)).numpy()
        np.testing.assert_array_equal(
            got, -self.sums[self.trained, None].astype(np.float32).repeat(DIM, 1)
        )


@pytest.fixture
def grow(tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path, 3, 2)
    yield fleet
    fleet.stop()


def _pull_fresh_rows(fleet: Fleet, trainer: Trainer):  # type: ignore[no-untyped-def]
    def on_step(step: str, job: ReshardJob) -> None:
        if step == "snapshot" and job.current == 0:  # rows created after the key list was read
            trainer.client.pull(fleet.spec.name, torch.from_numpy(PULLED))

    return on_step


def _owner_has(fleet: Fleet, keys: np.ndarray) -> None:
    """Every key is resident on its owner under the final map."""
    final = fleet.store.slot_map()
    for shard, client in enumerate(fleet.clients):
        mine = keys[final.shard_of(keys) == shard]
        if len(mine):
            request = ps_pb2.PullRequest(
                table=fleet.spec.name, epoch=final.epoch, keys=mine.astype("<i8").tobytes(),
                read_only=True,
            )  # fmt: skip
            reply = client.call(Rpc("Pull", request, lambda r: r))
            found = np.frombuffer(reply.found, np.uint8).astype(bool)
            assert found.all(), f"shard {shard}: {int((~found).sum())} rows missing"


def _rows_left(fleet: Fleet, shard: int, job: ReshardJob) -> int:
    """Rows ``shard`` still holds in the slots it moved out."""
    ranges = [r for b in job.batches if b.source == shard for r in b.ranges]
    if not ranges:
        return 0
    return int(fleet.clients[shard].call(checksums_rpc(fleet.spec.name, ranges)).rows.sum())


def test_two_to_three_with_a_trainer_running(grow: Fleet) -> None:
    trainer = Trainer(grow.endpoints, grow.spec.name)
    stale = Trainer(grow.endpoints, grow.spec.name)  # routes by the map it read now
    trainer.thread.start()
    run = grow.run(3, on_step=_pull_fresh_rows(grow, trainer))
    job = run.run(ReshardJob.start(grow.spec.name, grow.store.slot_map(), 3, batch_slots=2000))
    trainer.finish()
    assert job.phase == Phase.done and job.slots_moved == job.slots_total > 0
    final = grow.store.slot_map()
    assert final.num_shards == 3 and final.epoch == 1 + len(job.batches)
    for record in run.records:  # equal at the seal and at activation, optimizer state included
        assert not record.seal_checksums.differing(record.activation_checksums)
        assert record.seal_checksums.rows.sum() > 0
    rng = np.random.default_rng(11)
    stale.step(rng)  # refused by the old owners, refreshed, resent only there
    trainer.sums += stale.sums
    trainer.check()
    _owner_has(grow, PULLED)
    for shard in (0, 1):  # cleanup: the sources dropped what they moved out
        assert _rows_left(grow, shard, job) == 0


def test_three_to_two_empties_the_highest_shard(grow: Fleet) -> None:
    grow.run(3).run(ReshardJob.start(grow.spec.name, grow.store.slot_map(), 3))
    trainer = Trainer(grow.endpoints, grow.spec.name)
    trainer.thread.start()
    run = grow.run(2)
    job = run.run(ReshardJob.start(grow.spec.name, grow.store.slot_map(), 2, batch_slots=3000))
    trainer.finish()
    final = grow.store.slot_map()
    assert [(r.start, r.end, r.shard) for r in final.ranges] == [
        (r.start, r.end, r.shard) for r in SlotMap.initial(2).ranges
    ]
    assert {b.source for b in job.batches} == {2} and _rows_left(grow, 2, job) == 0
    for record in run.records:
        assert not record.seal_checksums.differing(record.activation_checksums)
    trainer.check()


def test_a_capped_copy_keeps_to_its_rate_and_moves_every_row(grow: Fleet) -> None:
    client = RecStoreClient(role="filler")
    client.set_ps_endpoints(grow.endpoints)
    client.init_data(
        grow.spec.name, (ROWS, DIM), torch.float32, optimizer={"kind": "sgd", "lr": 1.0}
    )
    keys = torch.arange(ROWS)
    grads = torch.arange(ROWS, dtype=torch.float32)[:, None].repeat(1, DIM)
    client.update(grow.spec.name, keys, grads, lr=1.0)  # every row resident, each its own
    began: dict[int, float] = {}
    sealed: dict[int, float] = {}

    def on_step(step: str, job: ReshardJob) -> None:
        marks = {"snapshot": began, "seal": sealed}.get(step)
        if marks is not None:
            marks[job.current] = time.monotonic()

    rate = 40_000.0  # bytes per second: about a second for this table's third
    run = grow.run(3, on_step=on_step, copy_rate=rate)
    job = run.run(ReshardJob.start(grow.spec.name, grow.store.slot_map(), 3, batch_slots=2000))
    assert job.phase == Phase.done and len(run.records) == len(job.batches) > 1
    for record in run.records:  # nothing wrote meanwhile: a batch's bytes are its copy's
        assert record.bytes > 0
        assert sealed[record.batch] - began[record.batch] >= record.bytes / rate
        assert not record.seal_checksums.differing(record.activation_checksums)
    got = client.pull(grow.spec.name, keys)
    torch.testing.assert_close(got, -grads, rtol=0, atol=0)
    client.close()


def _stats(fleet: Fleet, shard: int) -> ps_pb2.TableStats:
    request = ps_pb2.GetTableStatsRequest(table=fleet.spec.name)
    return fleet.clients[shard].call(Rpc("GetTableStats", request, lambda r: r))


def test_abort_before_commit_leaves_the_source_authoritative(grow: Fleet) -> None:
    trainer = Trainer(grow.endpoints, grow.spec.name)
    trainer.thread.start()
    seen: list[ps_pb2.TableStats] = []

    def fail_at_commit(step: str, job: ReshardJob) -> None:
        if step == "commit":
            seen.append(_stats(grow, job.batch.source))  # sealed, its state in TableStats
            raise RuntimeError("injected failure before the commit")

    job = ReshardJob.start(grow.spec.name, grow.store.slot_map(), 3, batch_slots=2000)
    with pytest.raises(RuntimeError, match="injected"):
        grow.run(3, on_step=fail_at_commit).run(job)
    trainer.finish()
    assert seen[0].migration.sealed and seen[0].migration.outgoing[0].shard == job.batch.target
    assert grow.store.slot_map() == SlotMap.initial(2)  # not committed
    for shard in range(3):
        assert not _stats(grow, shard).HasField("migration")  # unsealed, import discarded
    assert (
        _rows_left(
            grow,
            job.batch.target,
            ReshardJob(  # the target holds none of it
                job.table, 2, 3, (type(job.batch)(job.batch.target, 0, job.batch.ranges),)
            ),
        )
        == 0
    )
    trainer.check()  # every update reached the source, which kept serving


@pytest.mark.parametrize("step", ["snapshot", "tail", "commit", "activate", "cleanup"])
def test_provisioner_crash_at_a_step_is_finished_or_aborted_on_restart(
    grow: Fleet, step: str
) -> None:
    trainer = Trainer(grow.endpoints, grow.spec.name)
    trainer.thread.start()

    def crash(at: str, job: ReshardJob) -> None:
        if at == step and job.current == 1:
            raise Crash(at)

    job = ReshardJob.start(grow.spec.name, grow.store.slot_map(), 3, batch_slots=2000)
    with pytest.raises(Crash):
        grow.run(3, on_step=crash).run(job)
    stored = grow.store.job()
    assert stored is not None and stored.current == 1
    run = grow.run(3)  # a restarted provisioner, from what was stored
    done = run.resume(stored)
    trainer.finish()
    assert done.phase == Phase.done
    assert grow.store.slot_map().epoch == 1 + len(job.batches)
    for shard in (0, 1):
        assert _rows_left(grow, shard, done) == 0
    trainer.check()


@pytest.mark.parametrize("role", ["source", "target"])
def test_a_node_restarted_mid_copy_aborts_and_the_move_is_retried(
    tmp_path: Path, role: str
) -> None:
    fleet = Fleet(tmp_path, 3, 2)
    try:
        trainer = Trainer(fleet.endpoints, fleet.spec.name)
        rng = np.random.default_rng(5)
        for _ in range(10):
            trainer.step(rng)

        def restart(step: str, job: ReshardJob) -> None:
            if step == "catch-up" and job.current == 0:
                shard = job.batch.source if role == "source" else job.batch.target
                handle = fleet.handles[shard]
                port, data_dir = handle.port, tmp_path / f"node-{shard}"
                handle.stop()  # its reshard state is gone with it
                fleet.handles[shard] = start_in_thread(
                    port=port,
                    data_dir=data_dir,
                    shard_index=shard,
                    num_shards=2 if shard < 2 else 3,
                )

        job = ReshardJob.start(fleet.spec.name, fleet.store.slot_map(), 3, batch_slots=2000)
        with pytest.raises(ControlError, match=r"not (moving slots out|importing slots)"):
            fleet.run(3, on_step=restart).run(job)
        assert fleet.store.slot_map().epoch == 1
        stored = fleet.store.job()
        assert stored is not None
        done = fleet.run(3).resume(stored)
        for shard in (0, 1):
            assert _rows_left(fleet, shard, done) == 0
        for _ in range(10):
            trainer.step(rng)
        trainer.check()
    finally:
        fleet.stop()
