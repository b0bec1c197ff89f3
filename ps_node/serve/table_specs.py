"""Tables a node declares at start (``recstore ps-node --table-spec-file``).

The operator and the local provisioner declare a node's tables in files
rather than calling CreateTable after the pod is up. The node restores its
checkpoint and write-ahead log first, then creates each declared table that it
does not host yet. A table it already hosts under another spec is a deployment
error: the node refuses to start (exit status 2) rather than serve the wrong
table, and it creates nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from recstore.core import TableSpec
from recstore.ps.node import Node


class TableDeclarationError(ValueError):
    """A declared table cannot be hosted as declared (one line: the table and why)."""

    def __init__(self, table: str, reason: str, fields: Iterable[str] = ()) -> None:
        self.table = table
        self.fields = list(fields)
        super().__init__(f"table {table!r}: {reason}")


def load_spec_file(path: Path) -> list[TableSpec]:
    """The TableSpecs (wire form, ``TableSpec.to_wire()``) of a JSON or YAML file."""
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: {_one_line(error)}") from None
    items = data if isinstance(data, list) else [data]
    specs = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"{path}: entry {index} is not a table spec mapping")
        try:
            specs.append(TableSpec.model_validate(item))
        except ValidationError as error:
            raise ValueError(f"{path}: entry {index}: {_one_line(error)}") from None
    return specs


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out |= _flatten(value, f"{prefix}.{key}" if prefix else key)
    return out


def differing_fields(hosted: TableSpec, declared: TableSpec) -> list[str]:
    """``field (hosted X, declared Y)`` for every wire-form field that differs."""
    old, new = _flatten(hosted.to_wire()), _flatten(declared.to_wire())
    return [
        f"{name} (hosted {old.get(name)!r}, declared {new.get(name)!r})"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def node_spec(node: Node, name: str) -> TableSpec | None:
    """The spec the node has catalogued under ``name``: hosted, or refused (a table
    recovery could not restore is never recreated by a declaration)."""
    hosted, refusal = node.tables.get(name), node.refused.get(name)
    entry = hosted.entry if hosted is not None else refusal.entry if refusal else None
    return entry.spec if entry is not None else None


def check(node: Node, specs: list[TableSpec]) -> list[TableSpec]:
    """The declared specs the node must create; raises before anything is created."""
    wanted: dict[str, TableSpec] = {}
    for spec in specs:
        earlier = wanted.get(spec.name)
        if earlier is not None and earlier != spec:
            fields = differing_fields(earlier, spec)
            raise TableDeclarationError(
                spec.name, "declared twice with different specs: " + "; ".join(fields), fields
            )
        wanted[spec.name] = spec
    missing = []
    for name, spec in wanted.items():
        hosted_spec = node_spec(node, name)
        if hosted_spec is None:
            if spec.shards != node.num_shards:
                raise TableDeclarationError(
                    name, f"has {spec.shards} shards but the node runs with --num-shards "
                    f"{node.num_shards}", ["shards"],
                )  # fmt: skip
            missing.append(spec)
        elif hosted_spec != spec:
            fields = differing_fields(hosted_spec, spec)
            raise TableDeclarationError(
                name, "hosted with a different spec: " + "; ".join(fields), fields
            )
    return missing


def declare(node: Node, specs: list[TableSpec]) -> list[str]:
    """Create the declared tables the node lacks; returns their names."""
    missing = check(node, specs)
    for spec in missing:
        node.create_table(spec, None)
    return [spec.name for spec in missing]
