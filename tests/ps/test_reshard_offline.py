"""Offline resharding: checkpoints of N shards restore into M nodes, each keeping its slots.

In-process nodes (the Node API the servers run) in both durability modes,
compared with a single-table oracle fed the same writes: every row lands on
exactly its owner with its exact values and optimizer state, and the next
update step matches the oracle's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from recstore.cli import app
from recstore.core import CapacityExhausted, InvalidArgument, SlotMap, TableExists, TableSpec
from recstore.core.errors import CheckpointCorrupt, CheckpointNotFound
from recstore.ps import catalogue
from recstore.ps.checkpoint import persistence, recovery
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.node import Node
from recstore.ps.reshard import offline_restore
from recstore.store import Table

from .test_damaged_checkpoints import damage

DIM = 4
ADAGRAD = {"kind": "adagrad", "lr": 0.1}


def specs(shards: int, full_every: int = 1) -> list[TableSpec]:
    hashed = {"mode": "hashed", "capacity": 8192}
    checkpoint = {"full_every": full_every}
    return [
        TableSpec.model_validate(
            {"name": "hashed", "num_embeddings": 8192, "embedding_dim": DIM, "keys": hashed,
             "optimizer": ADAGRAD, "shards": shards, "checkpoint": checkpoint}
        ),
        TableSpec.model_validate(
            {"name": "dense", "num_embeddings": 600, "embedding_dim": DIM,
             "optimizer": ADAGRAD, "shards": shards, "checkpoint": checkpoint}
        ),
    ]  # fmt: skip


class Fleet:
    """N in-process nodes of one table set, plus the single-table oracles of the same writes."""

    def __init__(
        self, root: Path, shards: int, wal: bool, name: str = "old", full_every: int = 1
    ) -> None:
        self.shards, self.slot_map, self.full_every = shards, SlotMap.initial(shards), full_every
        self.nodes = [
            Node(root / f"{name}-{i}", shard_index=i, num_shards=shards, wal_enabled=wal)
            for i in range(shards)
        ]

    def create(self) -> None:
        for node in self.nodes:
            for spec in specs(self.shards, self.full_every):
                node.create_table(spec, None)

    def write(self, table: str, keys: np.ndarray, rows: np.ndarray, op: str) -> None:
        for shard in range(self.shards):
            mine = self.slot_map.shard_of(keys) == shard
            node, k, v = self.nodes[shard], keys[mine].tobytes(), rows[mine].tobytes()
            if op == "push":
                node.push(table, k, v, "float32", DIM)
            else:
                node.update(table, k, v, "float32", DIM, None)


class Oracle:
    def __init__(self) -> None:
        self.tables = {s.name: Table(s) for s in specs(1)}

    def write(self, table: str, keys: np.ndarray, rows: np.ndarray, op: str) -> None:
        getattr(self.tables[table], op)(keys, rows)


KEYS = {
    "hashed": np.random.default_rng(1).integers(-(2**62), 2**62, 1500),
    "dense": np.arange(600),
}


def feed(targets: list[Any], seed: int, steps: int = 2) -> None:
    """The same pushes and adagrad updates to every target (fleets and oracle)."""
    rng = np.random.default_rng(seed)
    for name, keys in KEYS.items():
        for step in range(steps):
            op = "push" if step == 0 and seed == 0 else "update"
            rows = rng.standard_normal((len(keys), DIM)).astype(np.float32)
            for target in targets:
                target.write(name, keys, rows, op)


def rows_of(table: Table) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for chunk in table.export_chunks():
        for key, values, state in zip(chunk.keys, chunk.values, chunk.state, strict=True):
            out[int(key)] = (values.copy(), state.copy())
    return out


def assert_matches(fleet: Fleet, oracle: Oracle) -> None:
    """Every oracle row on exactly its owner, with exact values and optimizer state."""
    for name, table in oracle.tables.items():
        expected = rows_of(table)
        owners = fleet.slot_map.shard_of(np.array(sorted(expected), dtype=np.int64))
        seen: set[int] = set()
        for shard, node in enumerate(fleet.nodes):
            hosted = node.tables[name]
            assert hosted.entry.spec.shards == fleet.shards
            got = rows_of(hosted.table)
            mine = {k for k, o in zip(sorted(expected), owners, strict=True) if o == shard}
            assert set(got) == mine, (name, shard)
            assert not seen & set(got)
            seen |= set(got)
            for key, (values, state) in got.items():
                np.testing.assert_array_equal(values, expected[key][0])
                np.testing.assert_array_equal(state, expected[key][1])
        assert seen == set(expected)


def checkpoint_all(fleet: Fleet) -> list[Path]:
    return [persistence.save(node).path for node in fleet.nodes]


@pytest.mark.parametrize("wal", [False, True], ids=["checkpoint", "wal"])
@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_reshard_restores_every_row_on_its_owner(
    tmp_path: Path, old: int, new: int, wal: bool
) -> None:
    before, oracle = Fleet(tmp_path, old, wal), Oracle()
    before.create()
    feed([before, oracle], seed=0)
    sources = checkpoint_all(before)

    after = Fleet(tmp_path, new, wal, name="new")
    for node in after.nodes:
        info = offline_restore.restore(node, sources)
        assert info.tables == ["dense", "hashed"]
        assert node.tables["hashed"].entry.slot_map == SlotMap(2, SlotMap.initial(new).ranges)
    assert_matches(after, oracle)

    feed([after, oracle], seed=1, steps=1)  # the next step, routed by the new map
    assert_matches(after, oracle)

    for shard, node in enumerate(after.nodes):  # a restart finds the restored state
        for name in list(node.tables):
            node.unhost(name)
        after.nodes[shard] = Node(node.data_dir, shard_index=shard, num_shards=new, wal_enabled=wal)
        recovery.recover(after.nodes[shard])
    if wal:  # the update after the restore came back from the log the restore began
        assert_matches(after, oracle)
    else:
        oracle_before_step = Oracle()
        feed([oracle_before_step], seed=0)
        assert_matches(after, oracle_before_step)


@pytest.mark.parametrize("wal", [False, True], ids=["checkpoint", "wal"])
@pytest.mark.parametrize("then", ["held", "erased"])
def test_only_each_slots_owner_restores_it_from_checkpoints_taken_during_a_move(
    tmp_path: Path, wal: bool, then: str
) -> None:
    """Checkpoints taken while a move runs: a node may hold copies of slots it does not
    own (a target's uncommitted import, a source's moved slots before the cleanup), and
    its next increment may erase them (the import aborted). Neither reaches the result."""
    before, oracle = Fleet(tmp_path, 2, wal, full_every=2), Oracle()
    before.create()
    feed([before, oracle], seed=0)

    def theirs(keys: np.ndarray) -> np.ndarray:  # a batch of node 0's rows (node 1 has room)
        return np.sort(keys[before.slot_map.shard_of(keys) == 0])[:120]

    for name, keys in KEYS.items():  # node 1 imports stale copies of node 0's rows
        stale = np.full((len(theirs(keys)), DIM), 7.0, np.float32)
        before.nodes[1].tables[name].table.import_chunk(theirs(keys), stale, stale)
    sources = checkpoint_all(before)
    if then == "erased":  # the import aborted: node 1's increment lists those keys as gone
        for name, keys in KEYS.items():
            before.nodes[1].tables[name].table.erase(theirs(keys))
        sources = checkpoint_all(before)
        tips = [checkpoint_read.read_manifest(path) for path in sources]
        assert all(len(tip.manifest["tables"]["dense"]["chain"]) == 1 for tip in tips)

    for new in (1, 3):
        after = Fleet(tmp_path, new, wal, name=f"new{new}")
        for node in after.nodes:
            offline_restore.restore(node, sources)
        assert_matches(after, oracle)


def _untouched(node: Node) -> None:
    assert node.tables == {} and node.refused == {}
    assert catalogue.load(node.data_dir) is None
    assert checkpoint_read.list_checkpoints(persistence.checkpoint_root(node)) == []


@pytest.fixture
def two_shard_sources(tmp_path: Path) -> list[Path]:
    fleet = Fleet(tmp_path, 2, wal=False)
    fleet.create()
    feed([fleet], seed=0, steps=1)
    return checkpoint_all(fleet)


@pytest.mark.parametrize("wal", [False, True], ids=["checkpoint", "wal"])
def test_damaged_source_refuses_whole_restore(
    tmp_path: Path, two_shard_sources: list[Path], wal: bool
) -> None:
    old_dir = two_shard_sources[1].parent.parent
    damage(old_dir, two_shard_sources[1].name, "state", table="hashed")
    node = Node(tmp_path / "new-0", shard_index=0, num_shards=3, wal_enabled=wal)
    with pytest.raises(CheckpointCorrupt, match="sha256 mismatch"):
        offline_restore.restore(node, two_shard_sources)
    _untouched(node)


def test_source_outside_allowed_root_refused(tmp_path: Path, two_shard_sources: list[Path]) -> None:
    node = Node(tmp_path / "fleet" / "new-0", shard_index=0, num_shards=3)
    with pytest.raises(InvalidArgument, match="not under the allowed root"):
        offline_restore.restore(node, two_shard_sources)  # root: tmp_path/fleet
    escaping = [tmp_path / "fleet" / ".." / p.relative_to(tmp_path) for p in two_shard_sources]
    with pytest.raises(InvalidArgument, match="not under the allowed root"):
        offline_restore.restore(node, escaping)
    _untouched(node)
    offline_restore.restore(node, two_shard_sources, allowed_root=tmp_path)  # an explicit root
    assert sorted(node.tables) == ["dense", "hashed"]


def test_incomplete_or_repeated_sources_refused(
    tmp_path: Path, two_shard_sources: list[Path]
) -> None:
    node = Node(tmp_path / "new-0", shard_index=0, num_shards=3)
    with pytest.raises(InvalidArgument, match="exactly once"):
        offline_restore.restore(node, two_shard_sources[:1])
    with pytest.raises(InvalidArgument, match="named twice"):
        offline_restore.restore(node, [*two_shard_sources, two_shard_sources[0]])
    with pytest.raises(CheckpointNotFound, match="not a checkpoint"):
        offline_restore.restore(node, [tmp_path])
    _untouched(node)


def test_restore_over_a_hosted_table_refused(tmp_path: Path, two_shard_sources: list[Path]) -> None:
    node = Node(tmp_path / "new-0", shard_index=0, num_shards=3)
    node.create_table(specs(3)[0], None)
    with pytest.raises(TableExists, match="drop them before a restore"):
        offline_restore.restore(node, two_shard_sources)
    assert sorted(node.tables) == ["hashed"] and node.tables["hashed"].table.size == 0


def test_restore_command(tmp_path: Path, two_shard_sources: list[Path]) -> None:
    runner, new_dir = CliRunner(), tmp_path / "new-1"
    argv = ["restore", "--data-dir", str(new_dir), "--shard-index", "1", "--num-shards", "3",
            "--durability", "wal"]  # fmt: skip
    for source in two_shard_sources:
        argv += ["--from", str(source)]
    outside = runner.invoke(app, [*argv, "--restore-root", str(tmp_path / "elsewhere")])
    assert outside.exit_code == 2 and "not under the allowed root" in outside.output
    done = runner.invoke(app, argv)
    assert done.exit_code == 0, done.output
    node = Node(new_dir, shard_index=1, num_shards=3, wal_enabled=True)
    recovery.recover(node)
    owners = SlotMap.initial(3).shard_of(KEYS["dense"])
    assert node.tables["dense"].table.size == int((owners == 1).sum())


def test_rows_that_do_not_fit_refuse_with_node_unchanged(tmp_path: Path) -> None:
    full = TableSpec.model_validate(
        {"name": "full", "num_embeddings": 64, "embedding_dim": 2,
         "keys": {"mode": "hashed", "capacity": 64}}
    )  # fmt: skip
    old = Node(tmp_path / "old-0")
    old.create_table(full, None)
    old.tables["full"].table.push(np.arange(64), np.ones((64, 2), np.float32))
    source = persistence.save(old).path
    node = Node(tmp_path / "new-0", shard_index=0, num_shards=2, wal_enabled=True)
    with pytest.raises(CapacityExhausted):  # half the capacity, more than half the slots' rows
        offline_restore.restore(node, [source])
    _untouched(node)
