"""Reading EmbeddingTable and EmbeddingPool YAML: the very files `kubectl apply` takes.

A file may hold several documents; each must be an EmbeddingTable whose spec
(table fields plus placement, or a pool) or an EmbeddingPool whose spec passes
the same validation the operator runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recstore.core.errors import InvalidArgument
from recstore.core.pool import POOL_NAME, PoolSpec, parse_pool
from recstore.core.reconcile import Declaration, parse_declaration
from recstore.core.resource import API_VERSION, KIND, POOL_KIND


@dataclass(frozen=True)
class PoolDeclaration:
    """A validated EmbeddingPool: its name and spec."""

    name: str
    spec: PoolSpec


def read_manifests(path: Path) -> list[Declaration | PoolDeclaration]:
    """The EmbeddingTables and EmbeddingPools of a file, in its order."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as error:
        raise InvalidArgument(f"{path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise InvalidArgument(f"{path}: not valid YAML ({error})") from error
    if not documents:
        raise InvalidArgument(f"{path}: no EmbeddingTable or EmbeddingPool in the file")
    return [declaration_of(doc, f"{path}[{i}]") for i, doc in enumerate(documents)]


def declaration_of(document: Any, where: str) -> Declaration | PoolDeclaration:
    if not isinstance(document, dict):
        raise InvalidArgument(f"{where}: expected a mapping, got {type(document).__name__}")
    kind = document.get("kind")
    if kind not in (KIND, POOL_KIND) or document.get("apiVersion") != API_VERSION:
        raise InvalidArgument(
            f"{where}: expected apiVersion {API_VERSION} kind {KIND} or {POOL_KIND}, "
            f"got {document.get('apiVersion')} {kind}"
        )
    metadata = document.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{where}: metadata.name is required")
    spec = document.get("spec")
    if not isinstance(spec, dict):
        raise InvalidArgument(f"{where}: spec is required")
    try:
        if kind == POOL_KIND:
            if not POOL_NAME.fullmatch(name):
                raise InvalidArgument(f"metadata.name: {name!r} is not a DNS label")
            return PoolDeclaration(name, parse_pool(spec))
        return parse_declaration(spec, default_name=name)
    except InvalidArgument as error:
        raise InvalidArgument(f"{where} ({name}): {error}") from error
