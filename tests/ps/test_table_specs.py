"""``--table-spec-file``: declared tables are created at start, after recovery, or refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from recstore.core import TableSpec
from recstore.ps.node import Node
from recstore.ps.serve.table_specs import (
    TableDeclarationError,
    declare,
    differing_fields,
    load_spec_file,
)

from .conftest import Client, spec


def write(path: Path, data: Any) -> Path:
    text = json.dumps(data) if path.suffix == ".json" else yaml.safe_dump(data)
    path.write_text(text)
    return path


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
@pytest.mark.parametrize("as_list", [False, True])
def test_spec_files_hold_one_spec_or_a_list(tmp_path: Path, suffix: str, as_list: bool) -> None:
    specs = [spec("a"), spec("b", dtype="float16", optimizer={"kind": "adam"})]
    data = [s.to_wire() for s in specs] if as_list else specs[0].to_wire()
    loaded = load_spec_file(write(tmp_path / f"t{suffix}", data))
    assert loaded == (specs if as_list else specs[:1])


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{not json", "t.json"),
        ('{"name": "a"}', "entry 0"),  # missing required fields
        ('[{"name": "a", "numEmbeddings": 10, "embeddingDim": 4}, 3]', "entry 1 is not"),
        ('{"name": "a", "numEmbeddings": 10, "embeddingDim": 4, "bogus": 1}', "bogus"),
    ],
)
def test_bad_spec_files_are_refused_with_the_path(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        load_spec_file(path)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.yaml"):
        load_spec_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("changes", "fields"),
    [
        ({}, []),
        ({"embedding_dim": 16}, ["embeddingDim (hosted 8, declared 16)"]),
        ({"optimizer": {"kind": "adam", "lr": 0.5}},
         ["optimizer.kind (hosted 'sgd', declared 'adam')",
          "optimizer.lr (hosted 0.01, declared 0.5)"]),
    ],
)  # fmt: skip
def test_differing_fields_name_each_field(changes: dict[str, Any], fields: list[str]) -> None:
    assert differing_fields(spec(), spec(**changes)) == fields


def test_declare_creates_missing_tables_once(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert declare(node, [spec("a"), spec("b")]) == ["a", "b"]
    assert declare(node, [spec("a"), spec("b"), spec("a")]) == []
    assert sorted(node.tables) == ["a", "b"]


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ([spec("new"), spec("a", embedding_dim=4)], "'a': hosted with a different spec: embed"),
        ([spec("new"), spec("new", embedding_dim=4)], "'new': declared twice"),
        ([spec("new"), spec("other", shards=2)], "'other': has 2 shards"),
    ],
)
def test_a_conflict_creates_nothing(
    tmp_path: Path, declared: list[TableSpec], message: str
) -> None:
    node = Node(tmp_path)
    declare(node, [spec("a")])
    with pytest.raises(TableDeclarationError, match=message):
        declare(node, declared)
    assert sorted(node.tables) == ["a"]


def test_node_declares_tables_after_restoring_its_data(tmp_path: Path, spawn: Any) -> None:
    specs = write(tmp_path / "tables.yaml", [spec("a").to_wire(), spec("b").to_wire()])
    first = spawn(tmp_path / "data", "--table-spec-file", str(specs))
    client = Client(first.address)
    assert client.names() == ["a", "b"]
    client.push("a", [1, 2], np.full((2, 8), 3.0, np.float32))
    client.close()
    assert first.terminate() == 0  # final checkpoint
    more = write(tmp_path / "more.json", spec("c").to_wire())
    again = spawn(
        tmp_path / "data", "--table-spec-file", str(specs), "--table-spec-file", str(more)
    )
    client = Client(again.address)
    assert client.names() == ["a", "b", "c"]
    np.testing.assert_array_equal(client.pull("a", [1, 2]), np.full((2, 8), 3.0))  # kept
    client.close()
    assert again.terminate() == 0


def test_node_with_a_conflicting_declaration_exits_2(tmp_path: Path, spawn: Any) -> None:
    data = tmp_path / "data"
    first = spawn(data, "--table-spec-file", str(write(tmp_path / "t.json", spec().to_wire())))
    assert first.terminate() == 0
    catalogue = (data / "tables.json").read_text()
    changed = write(tmp_path / "changed.json", spec(embedding_dim=16).to_wire())
    result = subprocess.run(
        [sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(data), "--table-spec-file", str(changed)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    error = json.loads(result.stderr.strip().splitlines()[-1])
    assert error["level"] == "error" and "'emb'" in error["msg"]
    assert "embeddingDim (hosted 8, declared 16)" in error["msg"]
    assert (data / "tables.json").read_text() == catalogue  # nothing changed


def test_unreadable_spec_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    result = subprocess.run(
        [sys.executable, "-m", "recstore.ps", "--data-dir", str(tmp_path / "d"),
         "--table-spec-file", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr
    assert not (tmp_path / "d").exists()
