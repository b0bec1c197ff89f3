"""A slot move's deletions are in the write-ahead log: kill -9 after them, restart, and
the node holds none of the rows it gave away (source cleanup) or discarded (target abort).

Without the erase records the replay brings those rows back into slots the node
does not own: refused to clients, but taking space and showing in stats and exports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recstore.core import SlotMap
from recstore.core.control import ControlClient, Rpc, create_table_rpc
from recstore.core.reshard.messages import checksums_rpc
from recstore.core.reshard.plan import Phase, ReshardJob
from recstore.core.reshard.protocol import ReshardRun
from recstore.local.reshard_store import FileJobStore
from recstore.v1 import ps_pb2

from .conftest import Client, spec

pytestmark = pytest.mark.slow

ROWS, DIM = 600, 4
KEYS = np.arange(ROWS)
TABLE = spec("moving", num_embeddings=ROWS, embedding_dim=DIM, shards=2)
START = SlotMap.initial(2)


class Pair:
    """Two WAL nodes serving ``TABLE`` at 2 shards; a move 2 -> 1 empties shard 1 into 0."""

    def __init__(self, root: Path, spawn: Any) -> None:
        self.root, self.spawn = root, spawn
        # as the provisioner sizes them: shard 0 is kept by both counts
        self.args = [["--shard-index", "0", "--num-shards", "1"],
                     ["--shard-index", "1", "--num-shards", "2"]]  # fmt: skip
        self.nodes = [self._start(shard) for shard in (0, 1)]
        for node in self.nodes:
            with ControlClient(node.address, timeout=60) as control:
                control.call(create_table_rpc(TABLE, START))
        owners = START.shard_of(KEYS)
        for shard, node in enumerate(self.nodes):
            mine = KEYS[owners == shard]
            Client(node.address).push(TABLE.name, mine, np.ones((len(mine), DIM), np.float32))
        self.store = FileJobStore(root / "job.json", START)
        self.moved = int((owners == 1).sum())

    def _start(self, shard: int) -> Any:
        return self.spawn(self.root / f"node-{shard}", "--durability", "wal", *self.args[shard])

    def restart(self, shard: int) -> None:
        """kill -9 the node and start it again on its data directory."""
        self.nodes[shard].kill()
        self.nodes[shard] = self._start(shard)

    def move(self, **hooks: Any) -> ReshardJob:
        job = ReshardJob.start(TABLE.name, START, 1, batch_slots=1 << 14)
        clients = [ControlClient(node.address, timeout=60) for node in self.nodes]
        try:
            return ReshardRun(TABLE.name, clients, self.store, **hooks).run(job)
        finally:
            for client in clients:
                client.close()

    def rows(self, shard: int) -> int:
        with ControlClient(self.nodes[shard].address, timeout=60) as control:
            request = ps_pb2.GetTableStatsRequest(table=TABLE.name)
            return int(control.call(Rpc("GetTableStats", request, lambda r: r)).size)

    def rows_in_moved_slots(self, shard: int) -> int:
        moving = [(r.start, r.end) for r in START.ranges if r.shard == 1]
        with ControlClient(self.nodes[shard].address, timeout=60) as control:
            return int(control.call(checksums_rpc(TABLE.name, moving)).rows.sum())


def test_source_killed_after_cleanup_holds_none_of_the_moved_rows(
    tmp_path: Path, spawn: Any
) -> None:
    pair = Pair(tmp_path, spawn)
    done = pair.move()
    assert done.phase == Phase.done and pair.rows(1) == 0 and pair.rows(0) == ROWS
    pair.restart(1)
    assert pair.rows(1) == 0  # the cleanup's erase record was replayed after the rows
    pair.restart(0)
    assert pair.rows(0) == ROWS


def test_target_killed_after_an_abort_holds_none_of_the_discarded_rows(
    tmp_path: Path, spawn: Any
) -> None:
    pair = Pair(tmp_path, spawn)

    def fail_at_commit(step: str, job: ReshardJob) -> None:
        if step == "commit":
            raise RuntimeError("injected failure before the commit")

    with pytest.raises(RuntimeError, match="injected"):
        pair.move(on_step=fail_at_commit)
    own = ROWS - pair.moved
    assert pair.rows(0) == own and pair.rows_in_moved_slots(0) == 0
    pair.restart(0)
    assert pair.rows(0) == own and pair.rows_in_moved_slots(0) == 0
    assert pair.rows(1) == pair.moved  # the source stayed authoritative
