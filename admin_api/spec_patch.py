"""Apply a partial table (or pool) spec to a stored one: pure functions, tested with
parameter tables.

A patch may use snake_case or camelCase at any depth; ``None`` resets a field
to its default. The result is validated as a whole TableSpec, so a patch is
accepted exactly when the table it produces would be accepted on create.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from recstore.core import TableSpec
from recstore.core.errors import InvalidArgument
from recstore.core.pool import PoolSpec, parse_pool
from recstore.core.spec import IMMUTABLE_FIELDS

#: What to do instead, where there is more to say than "create a new table".
_INSTEAD: dict[tuple[str, ...], str] = {
    ("mode",): (
        "create a new table; to serve trained rows read-only, restore a checkpoint with "
        "`recstore restore --mode inference` or load a state dict into a table with "
        "mode: inference"
    ),
}


def _nested_model(model: type[BaseModel], field: str) -> type[BaseModel] | None:
    info = model.model_fields.get(field)
    annotation = info.annotation if info else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def normalise_keys(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every camelCase alias of ``model`` (recursively) turned into its field name.

    Unknown keys are kept as they are, so validation names them in its error.
    """
    by_alias = {info.alias: name for name, info in model.model_fields.items() if info.alias}
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = key if key in model.model_fields else by_alias.get(key, key)
        nested = _nested_model(model, field)
        if nested is not None and isinstance(value, dict):
            value = normalise_keys(nested, value)
        out[field] = value
    return out


def _deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _lookup(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = data
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def apply_patch(current: TableSpec, changes: dict[str, Any]) -> TableSpec:
    """The spec ``changes`` turn ``current`` into.

    Raises pydantic.ValidationError for an invalid result and InvalidArgument
    for a change to a field that cannot change once the table exists.
    """
    changes = normalise_keys(TableSpec, changes)
    merged = _deep_merge(current.model_dump(mode="json"), changes)
    before = current.model_dump(mode="json")
    candidate = TableSpec.model_validate(merged)
    after = candidate.model_dump(mode="json")
    for path in IMMUTABLE_FIELDS:
        if _lookup(before, path) != _lookup(after, path):
            field = ".".join(path)
            raise InvalidArgument(
                f"{field} cannot change once the table exists "
                f"({_lookup(before, path)!r} -> {_lookup(after, path)!r}); "
                + _INSTEAD.get(path, "create a new table")
            )
    return candidate


def apply_pool_patch(current: PoolSpec, changes: dict[str, Any]) -> PoolSpec:
    """The pool spec ``changes`` turn ``current`` into (InvalidArgument naming every bad
    field of the result)."""
    merged = _deep_merge(current.model_dump(mode="json"), normalise_keys(PoolSpec, changes))
    return parse_pool(merged)
