"""A training fleet's checkpoint restored as inference tables (``recstore restore --mode``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from recstore.cli import app
from recstore.core import InferenceTable, TableMode, TableSpec
from recstore.ps.checkpoint import persistence, recovery
from recstore.ps.node import Node
from recstore.ps.reshard import offline_restore

DIM = 4
KEYS = np.arange(100)


def _spec(mode: str = "training") -> TableSpec:
    return TableSpec.model_validate(
        {"name": "emb", "num_embeddings": 100, "embedding_dim": DIM,
         "optimizer": {"kind": "adagrad", "lr": 0.1}, "mode": mode}
    )  # fmt: skip


def _trained_checkpoint(root: Path, mode: str = "training") -> tuple[Path, np.ndarray]:
    node = Node(root / "train-0")
    node.create_table(_spec(mode), None)
    rng = np.random.default_rng(0)
    table = node.tables["emb"].table
    table.push(KEYS, rng.standard_normal((100, DIM)).astype(np.float32))
    if mode == "training":
        table.update(KEYS, rng.standard_normal((100, DIM)).astype(np.float32))
    rows = table.pull(KEYS).copy()
    return persistence.save(node).path, rows


@pytest.mark.parametrize("wal", [False, True], ids=["checkpoint", "wal"])
def test_a_training_checkpoint_restores_as_an_inference_table(tmp_path: Path, wal: bool) -> None:
    source, rows = _trained_checkpoint(tmp_path)
    node = Node(tmp_path / "serve-0", wal_enabled=wal)
    offline_restore.restore(node, [source], mode=TableMode.inference)
    hosted = node.tables["emb"]
    assert hosted.entry.spec.inference and hosted.entry.spec.state_width == 0
    np.testing.assert_array_equal(hosted.table.pull(KEYS), rows)
    with pytest.raises(InferenceTable):
        hosted.table.update(KEYS[:1], np.ones((1, DIM), np.float32))
    # what the restore wrote is what a restart serves
    restarted = Node(tmp_path / "serve-0", wal_enabled=wal)
    recovery.recover(restarted)
    assert restarted.tables["emb"].entry.spec.inference
    np.testing.assert_array_equal(restarted.tables["emb"].table.pull(KEYS), rows)


def test_without_a_mode_the_saved_one_is_kept(tmp_path: Path) -> None:
    source, _ = _trained_checkpoint(tmp_path)
    node = Node(tmp_path / "serve-0")
    offline_restore.restore(node, [source])
    assert not node.tables["emb"].entry.spec.inference


def test_an_inference_checkpoint_restores_for_training_with_fresh_state(tmp_path: Path) -> None:
    source, rows = _trained_checkpoint(tmp_path, mode="inference")
    node = Node(tmp_path / "train-again-0")
    offline_restore.restore(node, [source], mode=TableMode.training)
    table = node.tables["emb"].table
    np.testing.assert_array_equal(table.pull(KEYS), rows)
    (chunk,) = table.export_chunks()
    assert chunk.state.shape == (100, DIM) and not chunk.state.any()
    table.update(KEYS, np.ones((100, DIM), np.float32))  # trains again


def test_restore_command_mode(tmp_path: Path) -> None:
    source, rows = _trained_checkpoint(tmp_path)
    runner, serve = CliRunner(), tmp_path / "serve-0"
    argv = ["restore", "--data-dir", str(serve), "--from", str(source)]
    bad = runner.invoke(app, [*argv, "--mode", "frozen"])
    assert bad.exit_code == 2 and "must be saved, inference or training" in bad.output
    assert not serve.exists() or not any(serve.iterdir())
    done = runner.invoke(app, [*argv, "--mode", "inference"])
    assert done.exit_code == 0, done.output
    node = Node(serve)
    recovery.recover(node)
    assert node.tables["emb"].entry.spec.inference
    np.testing.assert_array_equal(node.tables["emb"].table.pull(KEYS), rows)
