"""Incremental checkpoints: chains restore exactly, are verified link by link, and are kept whole.

In-process nodes: a "crash" is a new node on the same data dir with no final
checkpoint (the old one's logs made durable and closed first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
from typer.testing import CliRunner

from recstore.cli import app
from recstore.core import KeyMode, TableSpec, wire
from recstore.core.errors import CheckpointCorrupt
from recstore.ps import changes, native_path, row_transfer
from recstore.ps.checkpoint import incremental, persistence, recovery
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.node import Node
from recstore.ps.reshard import offline_restore
from recstore.ps.serve.server import start_in_thread
from recstore.ps.wal import segments as wal_segments
from recstore.store import Table
from recstore.v1 import ps_pb2

from .conftest import Client
from .test_damaged_checkpoints import damage

DIM = 8
OPTIMIZERS = {
    "adagrad": {"kind": "adagrad", "lr": 0.1},
    "adam": {"kind": "adam", "lr": 0.05},
    "rowwise_adagrad": {"kind": "rowwise_adagrad", "lr": 0.1},
    "sgd": {"kind": "sgd", "lr": 0.1},
}
KINDS = {  # table kind -> keys of the spec, and the key space the writes draw from
    "dense": ({"mode": "dense"}, 500),
    "hashed": ({"mode": "hashed", "capacity": 2000}, 800),
    "evicting": ({"mode": "hashed", "capacity": 150, "eviction": "lru"}, 600),
}


def table_spec(kind: str, optimizer: str, full_every: int = 4, keep: int = 10) -> TableSpec:
    keys, space = KINDS[kind]
    return TableSpec.model_validate(
        {
            "name": "emb", "num_embeddings": space if kind == "dense" else 10**6,
            "embedding_dim": DIM, "keys": keys, "optimizer": OPTIMIZERS[optimizer],
            "checkpoint": {"full_every": full_every, "keep": keep},
        }
    )  # fmt: skip


def snapshot(table: Table) -> tuple[Any, ...]:
    """Every row (sorted by key) with its optimizer state, and the table's step count."""
    chunk = table.export_keys(np.sort(table.keys()))
    return chunk.keys.copy(), chunk.values.copy(), chunk.state.copy(), table.optimizer_state()


def assert_same(got: tuple[Any, ...], want: tuple[Any, ...]) -> None:
    for a, b in zip(got[:3], want[:3], strict=True):
        np.testing.assert_array_equal(a, b)
    assert got[3] == want[3]


def settled(restored: Table, node: Node) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Snapshots of a table brought back by a log replay and of the live one, after pulling
    every key either holds into both: the log has no pulls, whose rows the initializer
    gives (a table that never evicts holds them as a pull would insert them)."""
    keys = np.union1d(restored.keys(), live(node).keys())
    for table in (restored, live(node)):
        table.pull(keys)
    return snapshot(restored), snapshot(live(node))


class Writer:
    """Random pushes, updates and pulls (which insert rows) on one node's table."""

    def __init__(self, node: Node, spec: TableSpec, seed: int = 3) -> None:
        self.node, self.spec = node, spec
        self.rng = np.random.default_rng(seed)
        self.space = KINDS["dense" if spec.key_mode == KeyMode.dense else "hashed"][1]
        if spec.keys.eviction != "none":
            self.space = KINDS["evicting"][1]

    def keys(self, n: int) -> np.ndarray:
        return np.unique(self.rng.integers(0, self.space, n)).astype(np.int64)

    def round(self, n: int = 60) -> None:
        keys = self.keys(n)
        rows = self.rng.standard_normal((len(keys), DIM)).astype(np.float32)
        self.node.push("emb", keys.tobytes(), rows.tobytes(), "float32", DIM)
        keys = self.keys(n)
        grads = self.rng.standard_normal((len(keys), DIM)).astype(np.float32)
        self.node.update("emb", keys.tobytes(), grads.tobytes(), "float32", DIM, None)
        keys = self.keys(n // 2)
        self.node.pull("emb", keys.tobytes(), np.empty((len(keys), DIM), np.float32))


def live(node: Node) -> Table:
    return node.tables["emb"].table


def restart(node: Node, **kwargs: Any) -> Node:
    """Stop ``node`` as a crash would (its log durable, no checkpoint) and recover its dir;
    its tables stay in memory (closed to the disk) to compare with."""
    for hosted in node.tables.values():
        if hosted.wal is not None:
            hosted.wal.wait_durable()
            hosted.wal.close()
            hosted.wal = None
    again = Node(node.data_dir, wal_enabled=node.wal_enabled)
    recovery.recover(again, **kwargs)
    return again


def kinds(node: Node) -> list[str]:
    root = persistence.checkpoint_root(node)
    return [incremental.kind_of(i, "emb") for i in checkpoint_read.list_checkpoints(root)]


@pytest.mark.parametrize(
    ("kind", "optimizer"),
    [
        ("dense", "adagrad"),
        ("hashed", "adam"),
        ("evicting", "rowwise_adagrad"),
        ("evicting", "sgd"),
    ],
)
def test_full_plus_increments_restore_the_live_table_exactly(
    tmp_path: Path, kind: str, optimizer: str
) -> None:
    node = Node(tmp_path / "node")
    node.create_table(table_spec(kind, optimizer), None)
    writer, saved = Writer(node, table_spec(kind, optimizer)), {}
    for _ in range(6):
        writer.round()
        info = persistence.save(node, keep=10)
        saved[info.checkpoint_id] = snapshot(live(node))
    assert kinds(node) == [
        "full",
        "incremental",
        "incremental",
        "incremental",
        "full",
        "incremental",
    ]
    if kind == "evicting":  # rows evicted since the base are carried as deletions
        infos = checkpoint_read.list_checkpoints(persistence.checkpoint_root(node))
        assert sum(i.manifest["tables"]["emb"]["files"]["deleted"]["shape"][0] for i in infos[1:4])
    want = snapshot(live(node))
    again = restart(node)
    assert_same(snapshot(live(again)), want)
    assert "emb" not in again.conditions  # restored from the newest checkpoint, nothing passed over
    for checkpoint_id in ("ckpt-00000003", "ckpt-00000004"):  # Load of a chain's tip
        persistence.load(again, checkpoint_id, keep=10)
        assert_same(snapshot(live(again)), saved[checkpoint_id])


def test_an_increment_after_touching_one_percent_is_about_one_percent(tmp_path: Path) -> None:
    spec = TableSpec.model_validate(
        {"name": "emb", "num_embeddings": 20000, "embedding_dim": 16,
         "optimizer": OPTIMIZERS["adagrad"], "checkpoint": {"full_every": 10}}
    )  # fmt: skip
    node = Node(tmp_path / "node")
    node.create_table(spec, None)
    everything = np.arange(20000, dtype=np.int64)
    rows = np.ones((20000, 16), np.float32)
    node.push("emb", everything.tobytes(), rows.tobytes(), "float32", 16)
    full = persistence.save(node)
    touched = np.random.default_rng(0).choice(20000, 200, replace=False).astype(np.int64)
    node.update("emb", touched.tobytes(), rows[:200].tobytes(), "float32", 16, None)
    increment = persistence.save(node)
    assert incremental.kind_of(increment, "emb") == "incremental"
    assert increment.rows == 200
    assert increment.bytes <= 0.012 * full.bytes


@pytest.mark.parametrize("durability", ["wal", "checkpoint"])
def test_a_damaged_middle_link_falls_back_loudly_to_the_newest_whole_chain(
    tmp_path: Path, durability: str
) -> None:
    # a log replay is exact where pulls cannot evict (they are not logged): no eviction there
    spec = table_spec("hashed" if durability == "wal" else "evicting", "adam", full_every=5)
    node = Node(tmp_path / "node", wal_enabled=durability == "wal")
    node.create_table(spec, None)
    writer, saved = Writer(node, spec), []
    for _ in range(3):
        writer.round()
        saved.append(snapshot(live(node)))
        persistence.save(node, keep=10)
    writer.round()  # only in the log
    damage(node.data_dir, "ckpt-00000002")
    damaged: list[CheckpointCorrupt] = []
    again = restart(node, on_damaged=damaged.append)
    if durability == "wal":  # ckpt 1 and the log from its generation
        assert_same(*settled(live(again), node))
    else:
        assert_same(snapshot(live(again)), saved[0])
    assert [(d.checkpoint_id, d.table) for d in damaged] == [("ckpt-00000002", "emb")]
    (condition,) = again.conditions["emb"]
    assert condition.type == recovery.RECOVERED and condition.reason == "FellBackToOlderCheckpoint"
    assert "'ckpt-00000003'" in condition.message and "'ckpt-00000002'" in condition.message
    with pytest.raises(CheckpointCorrupt, match="ckpt-00000002"):  # Load of the tip is refused
        persistence.load(again, "ckpt-00000003")


def test_a_missing_base_makes_the_increment_unusable(tmp_path: Path) -> None:
    node = Node(tmp_path / "node")
    node.create_table(table_spec("hashed", "adagrad"), None)
    writer = Writer(node, table_spec("hashed", "adagrad"))
    for _ in range(2):
        writer.round()
        persistence.save(node)
    info = checkpoint_read.list_checkpoints(persistence.checkpoint_root(node))[-1]
    (persistence.checkpoint_root(node) / "ckpt-00000001" / "manifest.json").unlink()
    with pytest.raises(CheckpointCorrupt, match=r"base checkpoint 'ckpt-00000001'.*missing"):
        checkpoint_read.verify_chain(info, "emb")


def test_retention_keeps_every_base_a_kept_chain_needs_and_its_log(tmp_path: Path) -> None:
    spec = table_spec("dense", "adagrad", full_every=3, keep=2)
    node = Node(tmp_path / "node", wal_enabled=True)
    node.create_table(spec, None)
    writer, root = Writer(node, spec), persistence.checkpoint_root(node)
    ids = []
    for _ in range(5):
        writer.round()
        ids.append(persistence.save(node, keep=2).checkpoint_id)
    listed = checkpoint_read.list_checkpoints(root)
    # 1 full, 2 3 increments, 4 full, 5 on 4: kept 4 5 (and 5's base 4); 1..3 go
    assert kinds(node) == ["full", "incremental"]
    assert [i.checkpoint_id for i in listed] == ids[3:]
    writer.round()
    ids.append(persistence.save(node, keep=2).checkpoint_id)  # 6 on 4, 5: all kept
    listed = checkpoint_read.list_checkpoints(root)
    assert [i.checkpoint_id for i in listed] == ids[3:]
    generation = persistence.logged_generation(listed[0], node.tables["emb"].entry)
    assert generation and wal_segments.reaches_back(
        node.wal_dir(node.tables["emb"].entry), generation
    )
    damage(node.data_dir, ids[4])  # the middle link: back to the full one and the whole log
    again = restart(node)
    assert_same(*settled(live(again), node))


def test_wal_restart_from_a_chain_replays_the_log_exactly(tmp_path: Path) -> None:
    spec = table_spec("hashed", "adagrad")
    node = Node(tmp_path / "node", wal_enabled=True)
    node.create_table(spec, None)
    writer = Writer(node, spec)
    for _ in range(3):
        writer.round()
        persistence.save(node)
    for _ in range(2):
        writer.round()
    again = restart(node)
    assert_same(*settled(live(again), node))
    assert "emb" not in again.conditions
    writer.node = again
    writer.round()
    # a recovered table starts a new chain: its changes since the chain are in the log only
    assert incremental.kind_of(persistence.save(again), "emb") == "full"


def test_offline_restore_accepts_the_tip_of_a_chain(tmp_path: Path) -> None:
    spec = table_spec("evicting", "adagrad")
    node = Node(tmp_path / "old-0")
    node.create_table(spec, None)
    writer = Writer(node, spec)
    for _ in range(3):
        writer.round()
        tip = persistence.save(node)
    want = snapshot(live(node))
    target = Node(tmp_path / "new-0")
    offline_restore.restore(target, [tip.path])
    assert_same(snapshot(live(target)), want)
    damage(node.data_dir, "ckpt-00000002")
    other = Node(tmp_path / "new-1")
    with pytest.raises(CheckpointCorrupt, match="ckpt-00000002"):
        offline_restore.restore(other, [tip.path])
    assert other.tables == {}


def test_full_every_must_be_at_least_one() -> None:
    with pytest.raises(pydantic.ValidationError, match="full_every"):
        table_spec("dense", "sgd", full_every=0)


def test_the_tracker_merges_repeats_while_drains_are_rare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(changes, "MERGE_AT", 100)
    tracker = changes.ChangeTracker.of_every_slot()
    for round_ in range(50):
        tracker.record(np.arange(round_ % 5, 40, dtype=np.int64))
    assert tracker._held <= 200  # 40 distinct keys, never the 1800 recorded
    assert tracker.pending == sum(40 - r % 5 for r in range(50))
    np.testing.assert_array_equal(tracker.drain(), np.arange(40))


def test_multi_update_and_import_rows_are_in_the_increment(tmp_path: Path) -> None:
    node = Node(tmp_path / "node")
    node.create_table(table_spec("hashed", "adagrad"), None)
    held = np.arange(0, 800, 7, dtype=np.int64)  # rows the base holds: changes, not new keys
    node.push("emb", held.tobytes(), np.ones((len(held), DIM), np.float32).tobytes(), "", DIM)
    persistence.save(node)
    keys = np.array([7, 14, 700], np.int64)
    grads = np.ones((3, DIM), np.float32)
    request = wire.encode_multi_update_request(
        [wire.UpdateRequest("emb", 0, keys, grads, "float32", None, DIM)]
    )
    native_path.serve(node, "MultiUpdate", request)
    imported = np.array([21, 28], np.int64)
    values, state = np.full((2, DIM), 2.0, np.float32), np.full((2, DIM), 3.0, np.float32)
    row_transfer.import_rows(
        node, "emb", imported.tobytes(), values.tobytes(), state.tobytes(),
        dtype="float32", dim=DIM, state_width=DIM,
    )  # fmt: skip
    increment = persistence.save(node)
    assert incremental.kind_of(increment, "emb") == "incremental"
    (chunk,) = checkpoint_read.table_chunks(increment, "emb")
    np.testing.assert_array_equal(chunk[0], np.union1d(keys, imported))
    again = restart(node)
    assert_same(snapshot(live(again)), snapshot(live(node)))


def test_load_rpc_and_restore_command_take_a_chain(tmp_path: Path) -> None:
    data_dir = tmp_path / "old-0"
    handle = start_in_thread(data_dir=data_dir)
    try:
        client = Client(handle.address)
        client.create(table_spec("hashed", "adam"))
        client.push("emb", np.arange(50), np.ones((50, DIM), np.float32))
        client.save("base")
        client.update("emb", np.arange(10, 20), np.ones((10, DIM), np.float32))
        client.save("tip")
        want = client.pull("emb", np.arange(50))
        client.update("emb", np.arange(50), np.ones((50, DIM), np.float32))
        client.call("Load", ps_pb2.LoadRequest(checkpoint_id="tip"))
        np.testing.assert_array_equal(client.pull("emb", np.arange(50)), want)
        client.close()
    finally:
        handle.stop(final_checkpoint=False)
    tip = checkpoint_read.read_manifest(data_dir / "checkpoints" / "tip")
    assert incremental.kind_of(tip, "emb") == "incremental"
    argv = ["restore", "--data-dir", str(tmp_path / "new-0"), "--shard-index", "0",
            "--num-shards", "1", "--from", str(tip.path)]  # fmt: skip
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 0, done.output
    restored = Node(tmp_path / "new-0")
    recovery.recover(restored)
    found, _ = live(restored).find(np.arange(50))
    np.testing.assert_array_equal(found, want)
