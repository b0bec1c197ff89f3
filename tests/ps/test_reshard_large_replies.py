"""Slot moves whose control replies outgrow gRPC's default 4 MiB receive limit.

A runner's calls to the nodes use the nodes' message limit
(``recstore.core.limits.grpc_options``): a seal's tail lists every resident key
of the batch's slots (8 bytes a key), and the de-dup window a trainer's large
requests fill travels in pages of bounded size. Both moves below failed with
RESOURCE_EXHAUSTED ("Received message larger than max") before, and retried
the same batch forever.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from recstore.client import RecStoreClient
from recstore.core import slot_of
from recstore.core.reshard import plan as reshard_plan
from recstore.core.reshard.drive import Shards, reshard, rows_per_slot
from recstore.core.reshard.messages import checksums_rpc
from recstore.core.reshard.plan import Phase, ReshardJob

from .test_reshard_online import DIM, ROWS, Fleet

WIDE_ROWS = 65_536  # ids a trainer's 4096-id request spreads over ~3600 slots
LONG_ROWS = 1_200_000  # half of them, one batch: a 4.8 MB key list in the tail


@pytest.fixture
def client() -> Iterator[RecStoreClient]:
    made = RecStoreClient(role="large-replies")
    yield made
    made.close()


def _trainer_on(fleet: Fleet, client: RecStoreClient, rows: int, dim: int = 1) -> None:
    client.set_ps_endpoints(fleet.endpoints)
    client.init_data(fleet.spec.name, (rows, dim), torch.float32,
                     optimizer={"kind": "sgd", "lr": 1.0})  # fmt: skip


def test_a_window_of_large_requests_moves_in_pages(tmp_path: Path, client: RecStoreClient) -> None:
    fleet = Fleet(tmp_path, 3, 2, rows=WIDE_ROWS, dim=1)
    try:
        _trainer_on(fleet, client, WIDE_ROWS)
        rng = np.random.default_rng(3)
        sums = np.zeros(WIDE_ROWS)
        for _ in range(700):  # ~5 MB of window entries, each touching ~3600 slots
            ids = rng.choice(WIDE_ROWS, 4096, replace=False)
            client.update(fleet.spec.name, torch.from_numpy(ids), -torch.ones(4096, 1), lr=1.0)
            sums[ids] += 1
        client.flush()
        job = fleet.run(3).run(
            ReshardJob.start(fleet.spec.name, fleet.store.slot_map(), 3, batch_slots=16384)
        )
        assert job.phase == Phase.done
        target = fleet.handles[2].server.node.get(fleet.spec.name)
        owned = target.owned_slots
        held = target.window.entries()
        # every update was one request to each source, and each touched slots shard 2 took
        assert len(held) == 2 * 700
        assert all(owned[entry.slots].all() for entry in held)  # and only those travelled
        got = client.pull(fleet.spec.name, torch.arange(WIDE_ROWS)).numpy()[:, 0]
        np.testing.assert_array_equal(got, sums)
    finally:
        fleet.stop()


def test_a_tail_listing_more_keys_than_four_mib_commits(
    tmp_path: Path, client: RecStoreClient
) -> None:
    fleet = Fleet(tmp_path, 2, 2, rows=LONG_ROWS, dim=1)
    try:
        _trainer_on(fleet, client, LONG_ROWS)
        client.pull(fleet.spec.name, torch.arange(LONG_ROWS))  # every row resident
        job = fleet.run(1).run(
            ReshardJob.start(fleet.spec.name, fleet.store.slot_map(), 1, batch_slots=16384)
        )
        assert job.phase == Phase.done and len(job.batches) == 1
        assert fleet.store.slot_map().num_shards == 1
        moved = [r for b in job.batches for r in b.ranges]
        rows = fleet.clients[0].call(checksums_rpc(fleet.spec.name, moved)).rows.sum()
        keys = np.arange(LONG_ROWS)
        assert rows == int(job.batches[0].mask()[slot_of(keys)].sum()) > 4 * 2**20 // 8
    finally:
        fleet.stop()


def test_a_new_move_sizes_its_batches_by_the_rows_per_slot(
    tmp_path: Path, client: RecStoreClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table dense enough that 1024 slots would hold more than ``BATCH_KEYS`` rows moves
    in smaller batches (here with the bound lowered to 50 rows, on 4000 rows), and every
    row is still where its owner serves it."""
    fleet = Fleet(tmp_path, 3, 2)
    try:
        _trainer_on(fleet, client, ROWS, DIM)
        client.pull(fleet.spec.name, torch.arange(ROWS))  # every row resident
        monkeypatch.setattr(reshard_plan, "BATCH_KEYS", 50)
        shards = Shards(
            name=fleet.spec.name, endpoints=lambda: fleet.endpoints, grow_to=lambda count: None,
            serving=lambda shard, slot_map: True, shrink_to=lambda count: None,
            report=lambda: None, show=lambda progress: None, tls=None, closed=threading.Event(),
        )  # fmt: skip
        densest = rows_per_slot(shards, fleet.store.slot_map())
        owners = fleet.store.slot_map().owner_table()
        held = np.bincount(owners[slot_of(np.arange(ROWS))], minlength=2)
        assert densest == max(held[i] / (owners == i).sum() for i in (0, 1))
        job = reshard(shards, fleet.store, 3)
        assert job is not None and job.phase == Phase.done
        sized = reshard_plan.sized_batch_slots(densest)
        assert sized < reshard_plan.DEFAULT_BATCH_SLOTS
        assert max(b.slots for b in job.batches) == sized
        got = client.pull(fleet.spec.name, torch.arange(ROWS))
        assert got.shape == (ROWS, DIM)
        assert fleet.store.slot_map().num_shards == 3
    finally:
        fleet.stop()
