"""Reading EmbeddingTable YAML: the very files `kubectl apply` takes.

A file may hold several documents; each must be an EmbeddingTable whose spec
(table fields plus placement) passes the same validation the operator runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from recstore.core.errors import InvalidArgument
from recstore.core.reconcile import Declaration, parse_declaration
from recstore.core.resource import API_VERSION, KIND


def read_declarations(path: Path) -> list[Declaration]:
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as error:
        raise InvalidArgument(f"{path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise InvalidArgument(f"{path}: not valid YAML ({error})") from error
    if not documents:
        raise InvalidArgument(f"{path}: no EmbeddingTable in the file")
    return [declaration_of(doc, f"{path}[{i}]") for i, doc in enumerate(documents)]


def declaration_of(document: Any, where: str) -> Declaration:
    if not isinstance(document, dict):
        raise InvalidArgument(f"{where}: expected a mapping, got {type(document).__name__}")
    if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
        raise InvalidArgument(
            f"{where}: expected apiVersion {API_VERSION} kind {KIND}, "
            f"got {document.get('apiVersion')} {document.get('kind')}"
        )
    metadata = document.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{where}: metadata.name is required")
    spec = document.get("spec")
    if not isinstance(spec, dict):
        raise InvalidArgument(f"{where}: spec is required")
    try:
        return parse_declaration(spec, default_name=name)
    except InvalidArgument as error:
        raise InvalidArgument(f"{where} ({name}): {error}") from error
