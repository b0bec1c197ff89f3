"""Rows written through ImportRows while their slots move: carried to the target, not lost.

ImportRows (an SDK ``import_rows``, a restore of exported rows) writes rows as
Push does; while their slots are being moved out, the source must track those
rows for the change stream and hold such writes while the slots are sealed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from recstore.core import slot_of
from recstore.core.reshard.plan import Phase, ReshardJob
from recstore.ps.serve.server import ServerHandle
from recstore.v1 import ps_pb2, ps_pb2_grpc

from .test_reshard_online import DIM, TRAINED, Fleet, Trainer


@pytest.fixture
def grow(tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path, 3, 2)
    yield fleet
    fleet.stop()


def _import(handle: ServerHandle, table: str, keys: np.ndarray, values: np.ndarray) -> int:
    chunk = ps_pb2.ExportRowsChunk(
        table=table, keys=keys.astype("<i8").tobytes(), values=values.astype("<f4").tobytes(),
        dtype="float32", dim=DIM,
    )  # fmt: skip
    with grpc.insecure_channel(handle.address) as channel:
        reply = ps_pb2_grpc.ParameterServerStub(channel).ImportRows(iter([chunk]), timeout=60)
    return int(reply.rows)


def test_rows_imported_during_the_copy_reach_the_target(grow: Fleet) -> None:
    job = ReshardJob.start(grow.spec.name, grow.store.slot_map(), 3, batch_slots=16384)
    batch = job.batches[0]
    moving = TRAINED[batch.mask()[slot_of(TRAINED)]]  # rows of the first batch's slots
    assert len(moving) > 0
    values = np.full((len(moving), DIM), 42.0, np.float32)
    imported: list[int] = []

    def import_while_copying(step: str, current: ReshardJob) -> None:
        if step == "catch-up" and current.current == 0:  # after the snapshot was read
            imported.append(_import(grow.handles[batch.source], grow.spec.name, moving, values))

    done = grow.run(3, on_step=import_while_copying).run(job)
    assert done.phase == Phase.done and imported == [len(moving)]
    reader = Trainer(grow.endpoints, grow.spec.name)  # routes by the map it reads now
    got = reader.client.pull(grow.spec.name, torch.from_numpy(moving)).numpy()
    np.testing.assert_array_equal(got, values)
