"""Every float of a table spec is finite: NaN and ±inf are refused naming the field, on
every surface (the model, CreateTable's spec_json, a declared CR's spec)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from recstore.core import InvalidArgument
from recstore.core.proto_convert import spec_from_json
from recstore.core.reconcile import parse_declaration
from recstore.core.spec import TableSpec

BASE: dict[str, Any] = {"name": "t", "numEmbeddings": 10, "embeddingDim": 4}


def _float_fields(schema: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...] = ()):
    """Paths (camelCase) of every number field in a JSON schema, nested models included."""
    for name, field in schema.get("properties", {}).items():
        options = field.get("anyOf", [field])
        for option in options:
            if "$ref" in option:
                yield from _float_fields(
                    defs[option["$ref"].rsplit("/", 1)[-1]], defs, (*path, name)
                )
            elif option.get("type") == "number":
                yield (*path, name)


SCHEMA = TableSpec.model_json_schema(by_alias=True)
FLOAT_FIELDS = sorted(set(_float_fields(SCHEMA, SCHEMA["$defs"])))


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(json.dumps(BASE))
    if path[0] == "keys":
        spec["keys"] = {"mode": "hashed"}  # ttlSeconds applies to hashed keys
    node = spec
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return spec


def test_the_float_fields_are_found() -> None:
    assert {("optimizer", "lr"), ("optimizer", "eps"), ("optimizer", "weightDecay"),
            ("optimizer", "beta1"), ("optimizer", "beta2"), ("initializer", "mean"),
            ("initializer", "std"), ("initializer", "low"), ("initializer", "high"),
            ("keys", "ttlSeconds")} <= set(FLOAT_FIELDS)  # fmt: skip


@pytest.mark.parametrize("path", FLOAT_FIELDS, ids=".".join)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=str)
def test_a_non_finite_float_is_refused_naming_the_field(
    path: tuple[str, ...], value: float
) -> None:
    with pytest.raises(ValidationError) as refused:
        TableSpec.model_validate(_with(path, value))
    (error,) = refused.value.errors()
    assert error["loc"] == path and error["type"] == "finite_number"
    assert "finite number" in error["msg"]


@pytest.mark.parametrize("path", FLOAT_FIELDS, ids=".".join)
def test_create_tables_spec_json_refuses_them_as_invalid_argument(path: tuple[str, ...]) -> None:
    for literal in ("NaN", "Infinity", "-Infinity", "1e400"):
        text = json.dumps(_with(path, "HERE")).replace('"HERE"', literal)
        with pytest.raises(InvalidArgument, match=r"spec_json is not JSON: .*must be finite"):
            spec_from_json(text)


def test_a_declared_spec_names_the_field_for_the_operator() -> None:
    declared = _with(("initializer", "std"), float("inf"))
    with pytest.raises(InvalidArgument, match=r"spec\.initializer\.std: Input should be a finite"):
        parse_declaration(declared, default_name="t")


def test_finite_extremes_are_still_accepted() -> None:
    spec = TableSpec.model_validate(_with(("initializer", "mean"), -1.7976931348623157e308))
    assert spec.initializer.mean == -1.7976931348623157e308
