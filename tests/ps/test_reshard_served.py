"""Offline resharding with real nodes on loopback: 2 served shards -> restore -> 3 served shards.

The new nodes start from the checkpoint the restore wrote, answer every key of
their slots with the oracle's rows, refuse the others with the new epoch, and
accept the table declared at its new shard count (what a provisioner sends).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from recstore.core import SlotMap
from recstore.core.routing import EPOCH_METADATA_KEY
from recstore.ps.reshard import offline_restore
from recstore.ps.serve.server import ServerHandle, start_in_thread

from .conftest import Client
from .test_reshard_offline import KEYS, Oracle, feed, specs


class ServedFleet:
    def __init__(self, root: Path, shards: int, durability: str, name: str) -> None:
        self.slot_map = SlotMap.initial(shards)
        self.dirs = [root / f"{name}-{i}" for i in range(shards)]
        self.handles: list[ServerHandle] = []
        for i, data_dir in enumerate(self.dirs):
            self.handles.append(
                start_in_thread(
                    data_dir=data_dir, shard_index=i, num_shards=shards, durability=durability
                )
            )
        self.clients = [Client(h.address) for h in self.handles]

    def write(self, table: str, keys: np.ndarray, rows: np.ndarray, op: str) -> None:
        for shard, client in enumerate(self.clients):
            mine = self.slot_map.shard_of(keys) == shard
            getattr(client, op)(table, keys[mine], rows[mine])

    def stop(self) -> None:
        for client, handle in zip(self.clients, self.handles, strict=True):
            client.close()
            handle.stop()  # with its final checkpoint


@pytest.mark.parametrize("durability", ["checkpoint", "wal"])
def test_served_fleet_reshards_two_to_three(tmp_path: Path, durability: str) -> None:
    old, oracle = ServedFleet(tmp_path, 2, durability, "old"), Oracle()
    for client in old.clients:
        for spec in specs(2):
            client.create(spec)
    feed([old, oracle], seed=0)
    sources = [d / c.save().path for d, c in zip(old.dirs, old.clients, strict=True)]
    old.stop()

    for i in range(3):
        offline_restore.restore_data_dir(
            tmp_path / f"new-{i}", sources,
            shard_index=i, num_shards=3, durability=durability,
        )  # fmt: skip
    new = ServedFleet(tmp_path, 3, durability, "new")
    try:
        for shard, client in enumerate(new.clients):
            for spec in specs(3):
                client.create(spec)  # the restored table, declared at its new shard count
            for name, table in oracle.tables.items():
                keys = KEYS[name][new.slot_map.shard_of(KEYS[name]) == shard]
                values, found = client.find(name, keys)
                assert found.all()
                np.testing.assert_array_equal(values, table.find(keys)[0])
            foreign = KEYS["dense"][new.slot_map.shard_of(KEYS["dense"]) != shard][:1]
            with pytest.raises(grpc.RpcError) as refused:
                client.pull("dense", foreign)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            epoch = dict(refused.value.trailing_metadata() or ())[EPOCH_METADATA_KEY]
            assert epoch == "2"
        feed([new, oracle], seed=1, steps=1)
        for shard, client in enumerate(new.clients):
            keys = KEYS["hashed"][new.slot_map.shard_of(KEYS["hashed"]) == shard]
            np.testing.assert_array_equal(
                client.find("hashed", keys)[0], oracle.tables["hashed"].find(keys)[0]
            )
    finally:
        new.stop()
