"""Checkpoint files: atomic commit, checksums (files and manifest), chunked read-back, pruning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recstore.core import InvalidArgument
from recstore.core.errors import CheckpointCorrupt, CheckpointNotFound
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.checkpoint import write as checkpoint


def chunks(rows: int, dim: int, width: int, size: int) -> tuple[list[Any], tuple[Any, ...]]:
    rng = np.random.default_rng(rows)
    keys = rng.permutation(10 * rows + 1)[:rows].astype(np.int64)
    values = rng.standard_normal((rows, dim)).astype(np.float32)
    state = rng.random((rows, width)).astype(np.float32)
    parts = [
        (keys[i : i + size], values[i : i + size], state[i : i + size])
        for i in range(0, rows, size)
    ]
    return parts, (keys, values, state)


def write(
    root: Path, cid: str, tables: dict[str, int], width: int = 2
) -> checkpoint.CheckpointInfo:
    writer = checkpoint.CheckpointWriter(
        root, cid, checkpoint_read.next_sequence(root), {"shard_index": 0}
    )
    for name, rows in tables.items():
        parts, _ = chunks(rows, 4, width, 7)
        writer.add_table(
            name,
            chunks=parts,
            dim=4,
            value_dtype=np.dtype("<f4"),
            state_width=width,
            meta={"spec": {"name": name}, "optimizer_state": {"step": np.int64(3)}},
        )
    return writer.commit()


@pytest.mark.parametrize(("rows", "width"), [(0, 2), (1, 0), (20, 1), (33, 8)])
def test_roundtrip_in_chunks(tmp_path: Path, rows: int, width: int) -> None:
    info = write(tmp_path, "a", {"t": rows}, width)
    found = checkpoint_read.find(tmp_path, None)
    assert found.checkpoint_id == "a" and found.rows == rows and found.tables == ["t"]
    assert found.manifest["tables"]["t"]["optimizer_state"] == {"step": 3}
    _, (keys, values, state) = chunks(rows, 4, width, 7)
    back = list(checkpoint_read.table_chunks(found, "t", chunk_rows=5))
    assert sum(len(k) for k, _, _ in back) == rows
    if rows:
        np.testing.assert_array_equal(np.concatenate([k for k, _, _ in back]), keys)
        np.testing.assert_array_equal(np.concatenate([v for _, v, _ in back]), values)
        np.testing.assert_array_equal(np.concatenate([s for _, _, s in back]), state)
    assert info.bytes == rows * (8 + 16 + 4 * width)


def test_newest_valid_wins_and_corruption_falls_back(tmp_path: Path) -> None:
    write(tmp_path, "first", {"t": 10})
    second = write(tmp_path, "second", {"t": 12})
    assert checkpoint_read.find(tmp_path, None).checkpoint_id == "second"
    values = second.path / "tables" / "t" / "values.bin"
    data = bytearray(values.read_bytes())
    data[0] ^= 1
    values.write_bytes(bytes(data))
    assert checkpoint_read.find(tmp_path, None).checkpoint_id == "first"
    with pytest.raises(CheckpointCorrupt, match="sha256"):
        checkpoint_read.find(tmp_path, "second")


def test_unfinished_save_is_invisible_and_cleaned(tmp_path: Path) -> None:
    write(tmp_path, "done", {"t": 3})
    writer = checkpoint.CheckpointWriter(tmp_path, "half", 2, {})
    writer.add_table("t", chunks=[], dim=4, value_dtype=np.dtype("<f4"), state_width=0, meta={})
    # no commit: the process died here
    assert [c.checkpoint_id for c in checkpoint_read.list_checkpoints(tmp_path)] == ["done"]
    checkpoint_read.remove_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done"]


def test_prune_keeps_newest(tmp_path: Path) -> None:
    for i in range(5):
        write(tmp_path, f"c{i}", {"t": 2})
    assert checkpoint_read.prune(tmp_path, 2) == ["c0", "c1", "c2"]
    assert [c.checkpoint_id for c in checkpoint_read.list_checkpoints(tmp_path)] == ["c3", "c4"]


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 200, "ok-1\n"])
def test_checkpoint_ids_are_validated(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidArgument):
        checkpoint.CheckpointWriter(tmp_path, bad, 1, {})


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFound):
        checkpoint_read.find(tmp_path, None)
    write(tmp_path, "a", {"t": 1})
    with pytest.raises(CheckpointNotFound):
        checkpoint_read.find(tmp_path, "b")
    with pytest.raises(InvalidArgument, match="already exists"):
        write(tmp_path, "a", {"t": 1})


def test_a_damaged_manifest_is_reported_not_skipped(tmp_path: Path) -> None:
    write(tmp_path, "old", {"t": 2})
    info = write(tmp_path, "new", {"t": 3})
    manifest = info.path / checkpoint.MANIFEST
    # still valid JSON, one digit changed: only the manifest's own checksum catches it
    manifest.write_text(manifest.read_text().replace('"rows": 3', '"rows": 2'))
    found = checkpoint_read.scan(tmp_path)
    assert [i.checkpoint_id for i in found.infos] == ["old"]
    assert [(d.checkpoint_id, d.table) for d in found.damaged] == [("new", None)]
    assert "manifest sha256 mismatch" in str(found.damaged[0])
    with pytest.raises(CheckpointCorrupt, match="checkpoint 'new'"):
        checkpoint_read.find(tmp_path, "new")
    seen: list[CheckpointCorrupt] = []
    assert checkpoint_read.find(tmp_path, None, seen.append).checkpoint_id == "old"
    assert [d.checkpoint_id for d in seen] == ["new"]


def test_a_truncated_file_does_not_verify(tmp_path: Path) -> None:
    info = write(tmp_path, "a", {"t": 5, "u": 5})
    keys = info.path / "tables" / "t" / "keys.bin"
    keys.write_bytes(keys.read_bytes()[:-8])
    with pytest.raises(CheckpointCorrupt, match="table 't': keys: 32 bytes, not 40"):
        checkpoint_read.verify_table(info, "t")
    checkpoint_read.verify_table(info, "u", from_disk=True)  # the other table is intact


def test_prune_spares_protected_checkpoints(tmp_path: Path) -> None:
    for i in range(4):
        write(tmp_path, f"c{i}", {"t": 2})
    assert checkpoint_read.prune(tmp_path, 1, protect={"c1"}) == ["c0", "c2"]
