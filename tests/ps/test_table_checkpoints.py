"""One table of a node checkpointed alone, as a pool's tables are: its neighbours untouched.

Real nodes on loopback, WAL and checkpoint durability. A Save naming tables writes
only those; the node keeps, per table, its newest checkpoints, so a neighbour's
checkpoint and the log it needs survive however often one table is saved alone;
a restart restores every table exactly (from its own newest checkpoint and its log).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.wal import segments as wal_segments
from recstore.v1 import ps_pb2

from .conftest import Client, spec

KEYS = np.arange(8)


def save(client: Client, *tables: str, checkpoint_id: str = "") -> Any:
    request = ps_pb2.SaveRequest(checkpoint_id=checkpoint_id, tables=list(tables))
    return client.call("Save", request).checkpoint


def updated(client: Client, table: str, value: float) -> None:
    client.update(table, KEYS, np.full((len(KEYS), 8), value, np.float32))


@pytest.mark.parametrize("durability", ["wal", "checkpoint"])
def test_a_table_saved_alone_leaves_its_neighbours_checkpoints_and_log(
    tmp_path: Path, start: Any, durability: str
) -> None:
    _, client = start(durability, keep_checkpoints=2)
    client.create(spec("a"))
    client.create(spec("b"))
    updated(client, "a", 1.0)
    updated(client, "b", 2.0)
    both = save(client, checkpoint_id="both")
    assert sorted(both.tables) == ["a", "b"]
    updated(client, "b", 3.0)  # after b's only checkpoint: in b's log (wal) alone
    for round_ in range(3):  # more than `keep` saves of a alone
        updated(client, "a", 4.0 + round_)
        alone = save(client, "a", checkpoint_id=f"a-{round_}")
        assert list(alone.tables) == ["a"]
    expected = {name: client.pull(name, KEYS) for name in ("a", "b")}

    kept = [i.checkpoint_id for i in checkpoint_read.list_checkpoints(tmp_path / "checkpoints")]
    assert kept == ["both", "a-1", "a-2"]  # b's newest checkpoint kept; a's newest two
    if durability == "wal":  # b's log is trimmed by b's own kept checkpoints, not a's
        for round_ in range(2):
            save(client, "b", checkpoint_id=f"b-{round_}")
        (log_dir,) = (tmp_path / "wal").glob("b-*")
        assert wal_segments.generations(log_dir)[0] == generation_of(tmp_path, "b-0", "b")

    _, again = start(durability)  # stopped as a crash stops it
    restored = {name: again.pull(name, KEYS) for name in ("a", "b")}
    np.testing.assert_array_equal(restored["a"], expected["a"])
    if durability == "wal":  # b's update after its checkpoint came back from its log
        np.testing.assert_array_equal(restored["b"], expected["b"])
    else:  # checkpoint durability: b is as its own newest checkpoint left it
        oracle = b_after_its_first_update()
        np.testing.assert_allclose(restored["b"], oracle, rtol=1e-6)


def generation_of(data_dir: Path, checkpoint_id: str, table: str) -> int:
    """The log generation checkpoint ``checkpoint_id`` records for ``table``."""
    (info,) = [
        i for i in checkpoint_read.list_checkpoints(data_dir / "checkpoints")
        if i.checkpoint_id == checkpoint_id
    ]  # fmt: skip
    return int(info.manifest["tables"][table]["wal_generation"])


def b_after_its_first_update() -> np.ndarray:
    """b after its first update alone (what its checkpoint 'both' holds)."""
    from recstore.store import Table

    table = Table(spec("b"))
    table.update(KEYS, np.full((len(KEYS), 8), 2.0, np.float32))
    return table.pull(KEYS)


def test_saving_a_table_the_node_does_not_hold_is_refused_and_writes_nothing(
    tmp_path: Path, start: Any
) -> None:
    _, client = start("wal")
    client.create(spec("a"))
    save(client, checkpoint_id="first")
    with pytest.raises(grpc.RpcError) as refused:
        save(client, "a", "ghost")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "cannot checkpoint 'ghost': not hosted on this node" in refused.value.details()
    listed = checkpoint_read.list_checkpoints(tmp_path / "checkpoints")
    assert [i.checkpoint_id for i in listed] == ["first"]
