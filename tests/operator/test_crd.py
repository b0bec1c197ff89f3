"""The CRD: generated from the models (spec and status), structural, fresh on disk, agreeing
with pydantic."""

from __future__ import annotations

import copy
import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from recstore.core.checkpoint_status import ShardCheckpoint, outcome, running
from recstore.core.errors import InvalidArgument
from recstore.core.reconcile import (
    Observation,
    Resharding,
    ShardState,
    compute_status,
    parse_declaration,
)
from recstore.core.status import EmbeddingTableStatus, TableStatus
from recstore.operator.crd import build_crd

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "helm/recstore/templates/crd.yaml"
EXAMPLES = sorted((ROOT / "examples/tables").glob("*.yaml"))
CRD = build_crd()
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def to_draft4(node: Any) -> Any:
    """OpenAPI 3.0 schema -> JSON Schema draft 4 (same bound semantics; nullable as a type)."""
    if isinstance(node, list):
        return [to_draft4(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_draft4(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


VALIDATOR = jsonschema.Draft4Validator(to_draft4(SCHEMA))


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the API server's defaulting does: fill absent fields, recursively."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    out = dict(value)
    for name, sub in schema["properties"].items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = apply_defaults(sub, out[name])
    return out


def test_checked_in_crd_is_fresh():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gen_crd.py"), "--check"], capture_output=True
    )
    assert result.returncode == 0, result.stderr.decode()
    # A chart template: its template lines (guard, chart labels) are not YAML.
    lines = [line for line in CRD_FILE.read_text().splitlines() if "{{" not in line]
    on_disk = yaml.safe_load("\n".join(lines))
    assert on_disk["spec"] == CRD["spec"]
    assert on_disk["metadata"]["name"] == CRD["metadata"]["name"]
    assert on_disk["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_crd_passes_strict_kubernetes_validation():
    assert kubernetes_validate.validate(CRD, kubernetes_validate.utils.latest_version(), True)


def _walk(node: Any, where: str = ""):
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            if key != "x-kubernetes-validations":  # CEL rules, not schema nodes
                yield from _walk(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{where}[{i}]")


def test_schema_is_structural():
    for where, node in _walk(SCHEMA):
        if where.endswith((".properties", ".default", ".enum")) or ".default." in where:
            continue
        for forbidden in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "const",
                          "patternProperties", "propertyNames"):  # fmt: skip
            assert forbidden not in node, f"{forbidden} at {where}"
        assert node.get("additionalProperties") is not False, where
        assert "type" in node, f"no type at {where}"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, where


def test_names_columns_and_status_subresource():
    spec = CRD["spec"]
    assert CRD["metadata"]["name"] == "embeddingtables.recstore.io"
    assert spec["names"]["shortNames"] == ["et"] and spec["names"]["kind"] == "EmbeddingTable"
    assert VERSION["name"] == "v1alpha1" and VERSION["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Ready": ".status.readyShards",
        "Shards": ".spec.shards",
        "Pool": ".spec.pool",
        "Dim": ".spec.embeddingDim",
        "Rows": ".spec.numEmbeddings",
        "Age": ".metadata.creationTimestamp",
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd(example):
    cr = yaml.safe_load(example.read_text())
    VALIDATOR.validate(cr)
    parse_declaration(cr["spec"], default_name=cr["metadata"]["name"])


def test_server_defaults_equal_the_model_defaults():
    spec = {"numEmbeddings": 10, "embeddingDim": 4}
    defaulted = apply_defaults(SCHEMA["properties"]["spec"], spec)
    VALIDATOR.validate({"spec": defaulted})
    from_defaults = parse_declaration(defaulted, default_name="t")
    assert from_defaults == parse_declaration(spec, default_name="t")
    wire = from_defaults.spec.to_wire()
    # shards and placement have no server default: a table on a pool declares neither
    assert "shards" not in defaulted and "placement" not in defaulted
    assert defaulted == {
        k: v for k, v in wire.items() if k not in ("name", "shards") and v is not None
    } | {"keys": {k: v for k, v in wire["keys"].items() if v is not None}}


@pytest.mark.parametrize(
    "spec",
    [
        {"numEmbeddings": 10, "embeddingDim": 0},
        {"numEmbeddings": 0, "embeddingDim": 4},
        {"numEmbeddings": 10, "embeddingDim": 4, "dtype": "int8"},
        {"numEmbeddings": 10, "embeddingDim": 4, "optimizer": {"lr": 0}},
        {"numEmbeddings": 10, "embeddingDim": 4, "optimizer": {"beta1": 1.0}},
        {"numEmbeddings": 10, "embeddingDim": 4, "initializer": {"seed": -1}},
        {"numEmbeddings": 10, "embeddingDim": 4, "keys": {"mode": "hashed", "ttlSeconds": 0}},
        {"numEmbeddings": 10, "embeddingDim": 4, "placement": {"gpus": 17}},
        {"numEmbeddings": 10, "embeddingDim": 4, "placement": {"resources": {"cpu": "1 core"}}},
        {"numEmbeddings": 10, "embeddingDim": 4, "placement": {"spread": "sometimes"}},
        {"numEmbeddings": 10, "embeddingDim": 4, "nonFinite": "skip_rows"},
        {"embeddingDim": 4},
    ],
)
def test_schema_and_models_reject_the_same_field_values(spec):
    assert not VALIDATOR.is_valid({"spec": spec})
    with pytest.raises(InvalidArgument):
        parse_declaration(spec, default_name="t")


@pytest.mark.parametrize(
    "spec",
    [
        {"numEmbeddings": 10, "embeddingDim": 4, "optimizer": {"lr": 1e-9, "beta1": 0.0}},
        {"numEmbeddings": 2**62, "embeddingDim": 8192, "shards": 1024},
        {"numEmbeddings": 10, "embeddingDim": 4, "keys": {"mode": "hashed", "capacity": None}},
        {"numEmbeddings": 10, "embeddingDim": 4, "placement": {"nodeSelector": {"a/b": "c"}}},
        {"numEmbeddings": 10, "embeddingDim": 4, "nonFinite": "skip-rows"},
        {"numEmbeddings": 10, "embeddingDim": 4, "nonFinite": "allow"},
    ],
)
def test_schema_and_models_accept_the_same_values(spec):
    VALIDATOR.validate({"spec": spec})
    parse_declaration(spec, default_name="t")


def _rules(node: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[str]]:
    """Every x-kubernetes-validations rule of the spec schema, by field path."""
    found = (
        {path: [r["rule"] for r in node["x-kubernetes-validations"]]}
        if ("x-kubernetes-validations" in node)
        else {}
    )
    for name, sub in node.get("properties", {}).items():
        found.update(_rules(sub, (*path, name)))
    return found


def test_the_fields_a_table_keeps_for_life_are_immutable_to_the_api_server():
    """kubectl apply cannot change what the admin API refuses to change (the row layout,
    the mode); everything else, shards first, stays open to updates."""
    from pydantic.alias_generators import to_camel

    from recstore.core.spec import IMMUTABLE_FIELDS

    spec = SCHEMA["properties"]["spec"]
    expected = {tuple(to_camel(part) for part in path) for path in IMMUTABLE_FIELDS}
    rules = _rules(spec)
    assert set(rules) == expected
    assert all(found == ["self == oldSelf"] for found in rules.values())
    assert ("shards",) not in rules and ("mode",) in rules and ("keys", "mode") in rules


# --- the status: generated from the one model the reconcile core returns ------------------

STATUS_VALIDATOR = jsonschema.Draft4Validator(to_draft4(SCHEMA["properties"]["status"]))
T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
SAVED = [ShardCheckpoint(index=0, endpoint="t-ps-0.t-ps.ml.svc.cluster.local:50051", rows=7,
                         bytes=56),
         ShardCheckpoint(index=1, endpoint="t-ps-1.t-ps.ml.svc.cluster.local:50051",
                         error="UNAVAILABLE: connection refused")]  # fmt: skip
FAILED = outcome("request-3", SAVED, now=T0, request_id=3)
COMPLETED = outcome("final-20260101T120000Z", SAVED[:1], now=T0)


def _shards(*ready: bool) -> tuple[ShardState, ...]:
    return tuple(
        ShardState(i, f"t-ps-{i}.t-ps.ml.svc.cluster.local:50051", r) for i, r in enumerate(ready)
    )


@pytest.mark.parametrize(
    ("kwargs", "previous"),
    [
        ({"problem": "spec.embeddingDim: " + "x" * 3000, "observation": Observation()}, None),
        ({"observation": Observation(2, False, _shards(True, True))}, None),
        ({"observation": Observation(2, True, _shards(True, False),
                                     checkpoint_request=running(3))}, "Ready"),
        ({"observation": Observation(2, False, _shards(True, True), last_checkpoint=COMPLETED,
                                     checkpoint_request=FAILED)}, "Ready"),
        ({"observation": Observation(3, False, _shards(True, True, False),
                                     resharding=Resharding(2, 3, 100, 5461, 4096, 2),
                                     queued_shards=4)}, "Ready"),
        ({"observation": Observation(2, False, _shards(False, False), refused="no GPU")}, None),
        ({"observation": Observation(2, False, _shards(True, True)), "deleting": True}, "Ready"),
    ],
)  # fmt: skip
def test_the_reconcile_cores_status_fits_the_crd_and_the_admin_apis_model(kwargs, previous):
    args = {"problem": None, "declared_shards": 2, **kwargs}
    stored = TableStatus(phase=previous) if previous else None
    status = compute_status(**args, generation=2, previous=stored, now=T0)
    wire = status.to_wire()
    STATUS_VALIDATOR.validate(wire)
    # the admin API's PUT body is the same model: what the operator writes, it takes as is
    assert TableStatus.model_validate(wire) == status
    # what the API server stores (a merge patch drops the nulls) reads back the same
    stored_back = {k: v for k, v in wire.items() if v is not None}
    assert TableStatus.model_validate(stored_back) == status


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Ready", "lastCheckpoint": "final-20260101T000000Z"},  # a bare id: not the shape
        {"phase": "Ready", "checkpointRequest": {"id": "request-1", "state": "Done"}},
        {"phase": "Ready", "checkpointRequest": {"state": "Running"}},
        {"phase": "Ready", "lastCheckpoint": {"id": "x" * 129, "state": "Completed"}},
        {"phase": "Unknown"},
        {"phase": "Ready", "conditions": [{"type": "Ready", "status": "Maybe"}]},
        {"phase": "Ready", "shards": [{"index": 1024}]},
        {"phase": "Ready", "slotMap": {"epoch": 0, "ranges": []}},
        {"phase": "Ready", "slotMap": {"epoch": 2, "ranges": [[0, 10]]}},
    ],
)
def test_the_crd_and_the_model_refuse_the_same_statuses(status):
    assert not STATUS_VALIDATOR.is_valid(status)
    with pytest.raises(ValidationError):
        TableStatus.model_validate(status)


def test_the_move_record_is_kept_as_the_operator_writes_it():
    job = {"table": "t", "from_shards": 2, "to_shards": 3, "batches": [], "phase": "copy"}
    node = SCHEMA["properties"]["status"]["properties"]["migrationJob"]
    assert node["x-kubernetes-preserve-unknown-fields"] is True and "properties" not in node
    STATUS_VALIDATOR.validate({"phase": "Resharding", "migrationJob": job})
    assert (
        EmbeddingTableStatus.model_validate(
            {"phase": "Resharding", "migrationJob": job}
        ).migration_job
        == job
    )
