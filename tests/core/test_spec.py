"""The table spec: defaults, both spellings, and the rejections every surface inherits."""

from typing import Any

import pytest
from pydantic import ValidationError

from recstore.core.spec import TableSpec


def test_defaults_and_camel_case_round_trip() -> None:
    spec = TableSpec(name="user_emb", num_embeddings=1000, embedding_dim=16)
    wire = spec.to_wire()
    assert wire["numEmbeddings"] == 1000 and wire["keys"] == {
        "mode": "dense",
        "capacity": None,
        "eviction": "none",
        "ttlSeconds": None,
    }
    assert TableSpec.model_validate(wire) == spec
    assert spec.capacity == 1000 and spec.row_bytes == 64


def test_hashed_capacity_and_state_width() -> None:
    spec = TableSpec.model_validate(
        {
            "name": "items",
            "numEmbeddings": 10**9,
            "embeddingDim": 8,
            "dtype": "bfloat16",
            "keys": {"mode": "hashed", "capacity": 5000, "eviction": "lru"},
            "optimizer": {"kind": "adam"},
        }
    )
    assert spec.capacity == 5000 and spec.row_bytes == 16
    assert spec.optimizer.state_width(8) == 16


@pytest.mark.parametrize(
    ("given", "policy"),
    [
        ({}, "reject"),  # the default: NaN and Inf are refused
        ({"nonFinite": "reject"}, "reject"),
        ({"nonFinite": "skip-rows"}, "skip-rows"),
        ({"non_finite": "skip-rows"}, "skip-rows"),
        ({"nonFinite": "allow"}, "allow"),
    ],
)
def test_non_finite_policy_both_spellings(given: dict[str, Any], policy: str) -> None:
    spec = TableSpec.model_validate({"name": "t", "numEmbeddings": 10, "embeddingDim": 4, **given})
    assert spec.non_finite == policy
    assert spec.to_wire()["nonFinite"] == policy
    assert TableSpec.model_validate(spec.to_wire()) == spec


@pytest.mark.parametrize(
    ("given", "mode"), [({}, "training"), ({"mode": "inference"}, "inference")]
)
def test_mode_defaults_to_training_and_round_trips(given: dict[str, Any], mode: str) -> None:
    spec = TableSpec.model_validate(
        {
            "name": "t",
            "numEmbeddings": 10,
            "embeddingDim": 4,
            "optimizer": {"kind": "adam"},
            **given,
        }
    )
    assert spec.mode == mode and spec.to_wire()["mode"] == mode
    assert TableSpec.model_validate(spec.to_wire()) == spec
    # the optimizer is kept either way; an inference table holds no state for it
    assert spec.optimizer.kind == "adam"
    assert spec.state_width == (0 if mode == "inference" else 8)


@pytest.mark.parametrize(
    ("given", "wire_dtype"),
    [
        ({}, "float32"),
        ({"transportDtype": "bfloat16"}, "bfloat16"),
        ({"transport_dtype": "float16"}, "float16"),
        ({"dtype": "float16", "transportDtype": "float16"}, "float16"),
        ({"dtype": "bfloat16"}, "bfloat16"),
    ],
)
def test_transport_dtype_both_spellings(given: dict[str, Any], wire_dtype: str) -> None:
    spec = TableSpec.model_validate({"name": "t", "numEmbeddings": 10, "embeddingDim": 4, **given})
    assert spec.wire_dtype == wire_dtype
    assert TableSpec.model_validate(spec.to_wire()) == spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "Bad Name"}, "pattern"),
        ({"name": "-lead"}, "pattern"),
        ({"num_embeddings": 0}, "greater than or equal to 1"),
        ({"embedding_dim": 0}, "greater than or equal to 1"),
        ({"embedding_dim": 100_000}, "less than or equal to 8192"),
        ({"dtype": "int8"}, "float32"),
        ({"shards": 0}, "greater than or equal to 1"),
        ({"keys": {"mode": "dense", "eviction": "lru"}}, "hashed keys only"),
        ({"initializer": {"kind": "uniform", "low": 1, "high": 0}}, "low < high"),
        ({"optimizer": {"kind": "adam", "lr": 0}}, "greater than 0"),
        ({"optimizer": {"kind": "lamb"}}, "sgd"),
        ({"checkpoint": {"keep": 0}}, "greater than or equal to 1"),
        ({"surprise": 1}, "Extra inputs are not permitted"),
        ({"non_finite": "drop"}, "'reject', 'skip-rows' or 'allow'"),
        ({"nonFinite": "skip_rows"}, "'reject', 'skip-rows' or 'allow'"),
        ({"nonFinite": None}, "'reject', 'skip-rows' or 'allow'"),
        ({"mode": "serving"}, "'training' or 'inference'"),
        ({"mode": "read-only"}, "'training' or 'inference'"),
        ({"transport_dtype": "int8"}, "float32"),
        ({"dtype": "float16", "transport_dtype": "bfloat16"}, "needs a float32 table"),
        ({"dtype": "bfloat16", "transportDtype": "float32"}, "needs a float32 table"),
    ],
)
def test_rejections_name_the_problem(change: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"name": "t", "num_embeddings": 10, "embedding_dim": 4, **change}
    with pytest.raises(ValidationError, match=message):
        TableSpec(**fields)
