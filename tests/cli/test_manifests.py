"""EmbeddingTable and EmbeddingPool YAML as `recstore apply -f` reads it: the operator's
validation, clear errors."""

from pathlib import Path

import pytest

from recstore.cli.manifests import PoolDeclaration, read_manifests
from recstore.core.errors import InvalidArgument

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
apiVersion: recstore.io/v1alpha1
kind: EmbeddingTable
metadata: {name: items}
spec: {numEmbeddings: 100, embeddingDim: 8, shards: 2}
---
apiVersion: recstore.io/v1alpha1
kind: EmbeddingTable
metadata: {name: users}
spec: {numEmbeddings: 50, embeddingDim: 4, optimizer: {kind: adagrad, lr: 0.1}}
---
apiVersion: recstore.io/v1alpha1
kind: EmbeddingPool
metadata: {name: shared}
spec: {shards: 3}
"""


def test_multi_document_file(tmp_path: Path) -> None:
    path = tmp_path / "tables.yaml"
    path.write_text(GOOD)
    *tables, pool = read_manifests(path)
    assert [(d.spec.name, d.spec.shards, d.spec.optimizer.kind) for d in tables] == [
        ("items", 2, "sgd"),
        ("users", 1, "adagrad"),
    ]
    assert isinstance(pool, PoolDeclaration) and (pool.name, pool.spec.shards) == ("shared", 3)


@pytest.mark.parametrize("example", sorted((ROOT / "examples/tables").glob("**/*.yaml")))
def test_shipped_examples_are_valid(example: Path) -> None:
    assert read_manifests(example)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no EmbeddingTable"),
        ("a: [", "not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "expected apiVersion"),
        (
            "apiVersion: recstore.io/v1alpha1\nkind: EmbeddingTable\nmetadata: {}\nspec: {}\n",
            "metadata.name is required",
        ),
        (
            "apiVersion: recstore.io/v1alpha1\nkind: EmbeddingTable\nmetadata: {name: t}\n",
            "spec is required",
        ),
        (
            "apiVersion: recstore.io/v1alpha1\nkind: EmbeddingTable\nmetadata: {name: t}\n"
            "spec: {numEmbeddings: 0, embeddingDim: 8}\n",
            "numEmbeddings",
        ),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InvalidArgument, match=message):
        read_manifests(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="No such file"):
        read_manifests(tmp_path / "absent.yaml")
