"""The capacity check before a move: a target that cannot grow is refused up front."""

from __future__ import annotations

from typing import Any

import pytest

from recstore.core import CapacityExhausted, SlotMap, TableSpec
from recstore.core.proto_convert import TableStats
from recstore.core.reshard.capacity import check_targets, grows_online, peak_slots
from recstore.core.reshard.plan import ReshardJob
from recstore.core.routing import NUM_SLOTS
from recstore.core.shard_rows import rows_for_slots


class Node:
    """Answers GetTableStats with a fixed capacity, counting the calls."""

    def __init__(self, spec: TableSpec, shard: int, capacity: int) -> None:
        self.spec, self.shard, self.capacity, self.calls = spec, shard, capacity, 0

    def call(self, rpc: Any) -> TableStats:
        assert rpc.method == "GetTableStats"
        self.calls += 1
        return TableStats(
            table=self.spec.name, size=0, capacity=self.capacity, memory_bytes=0,
            dtype="float32", dim=self.spec.embedding_dim, spec=self.spec,
            shard_index=self.shard, num_shards=4, slot_map=None,
        )  # fmt: skip


def _spec(storage: str) -> TableSpec:
    return TableSpec.model_validate(
        {"name": "t", "num_embeddings": 4000, "embedding_dim": 4, "shards": 4, "storage": storage}
    )


def test_a_gpu_target_too_small_for_what_it_will_own_is_refused_before_anything() -> None:
    spec = _spec("gpu")
    nodes = [Node(spec, i, 1364) for i in range(4)]
    job = ReshardJob.start("t", SlotMap.initial(4), 1)
    with pytest.raises(
        CapacityExhausted, match=r"shard 0 would own 16384 slots, needing 4000 rows"
    ):
        check_targets("t", nodes, job, SlotMap.initial(4))  # type: ignore[arg-type]
    assert [n.calls for n in nodes] == [1, 0, 0, 0]  # only the target was asked


def test_a_gpu_target_with_room_and_a_host_target_pass() -> None:
    job = ReshardJob.start("t", SlotMap.initial(4), 2)
    big = [Node(_spec("gpu"), i, 4000) for i in range(4)]
    check_targets("t", big, job, SlotMap.initial(4))  # type: ignore[arg-type]
    small = [Node(_spec("host"), i, 1364) for i in range(4)]
    check_targets("t", small, job, SlotMap.initial(4))  # type: ignore[arg-type]  # grows
    assert grows_online(_spec("host")) and not grows_online(_spec("gpu"))


def test_peak_slots_counts_what_a_target_owns_now_and_gets() -> None:
    job = ReshardJob.start("t", SlotMap.initial(4), 2)
    assert peak_slots(SlotMap.initial(4), job, 0) == NUM_SLOTS // 2
    assert peak_slots(SlotMap.initial(4), job, 3) == NUM_SLOTS // 4  # a source only
    assert rows_for_slots(_spec("host"), NUM_SLOTS) == 4000
