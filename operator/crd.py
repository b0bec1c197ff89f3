"""The EmbeddingTable CRD, generated from the table spec, placement and status models.

The CRD's schema is derived from ``TableSpec`` and ``Placement`` (the spec) and
``EmbeddingTableStatus`` (the status; pydantic's JSON schema) so the API server
validates and defaults exactly what the operator, the admin API and the SDK accept,
and keeps exactly the status they write and read. Pydantic writes JSON Schema
2020-12; Kubernetes wants a *structural* OpenAPI v3 schema, so this module
inlines ``$ref``s, turns ``anyOf [X, null]`` into ``nullable`` and
``patternProperties`` into ``additionalProperties``, rewrites numeric
exclusive bounds into their OpenAPI 3.0 form, drops what Kubernetes
refuses (``title``, ``additionalProperties: false``, ``propertyNames``; an open
object's ``additionalProperties: true``, which must say
``x-kubernetes-preserve-unknown-fields`` instead), and defaults nested objects to
``{}`` so the server fills in their fields.
``scripts/gen_crd.py`` writes the result into the chart; a test fails when
the checked-in YAML is stale.

Finiteness (``WireModel``'s ``allow_inf_nan=False``: no NaN or ±inf hyper-parameter)
has no OpenAPI v3 keyword, so the schema cannot say it. Nothing non-finite gets
through the API server either way: JSON has no NaN or Infinity literal (kubectl
cannot encode YAML's ``.nan``/``.inf`` into it), and a number that overflows a
float64 (``1e400``) fails the server's decoding. The operator validates every
spec with the model itself, which refuses them naming the field.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic.alias_generators import to_camel

from recstore.core.placement import Placement
from recstore.core.pool import POOL_NAME
from recstore.core.resource import (
    CHECKPOINT_REQUEST_ANNOTATION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from recstore.core.spec import IMMUTABLE_FIELDS, TableSpec
from recstore.core.status import EmbeddingTableStatus

_PRESERVE = "x-kubernetes-preserve-unknown-fields"

_DROPPED_KEYS = {"title", "propertyNames", "$defs", "discriminator"}

#: `kubectl explain` texts for the fields whose models carry no description.
_DESCRIPTIONS = {
    "name": "Table name clients use; defaults to metadata.name (may contain underscores).",
    "numEmbeddings": "Rows of a dense table (ids 0..n-1); default capacity of a hashed one.",
    "embeddingDim": "Values per row.",
    "dtype": "Value type of the stored rows.",
    "shards": "PS nodes the table is split over (one pod each). Changing it needs resharding.",
    "keys": "Key mode: dense ids, or hashed int64 keys with a capacity and eviction.",
    "initializer": "How missing rows are initialised (deterministic from key and seed).",
    "optimizer": "Optimizer the PS applies to pushed gradients.",
    "storage": "Where rows live: host memory (default) or GPU memory (needs placement.gpus).",
    "checkpoint": "Periodic checkpoints and write durability.",
    "transportDtype": "Dtype a float32 table's rows and gradients travel in over gRPC "
    "(float16 or bfloat16: half the bytes; the node keeps float32). Unset: the table dtype.",
    "placement": "Image, resources, GPUs and node constraints of the shard pods (not with pool).",
    "pool": "The EmbeddingPool whose nodes hold the table (then no shards nor placement of "
    "its own); unset: a fleet of its own.",
}

#: `kubectl explain` texts of the status fields (the nested models carry their docstrings).
_STATUS_DESCRIPTIONS = {
    "phase": "Pending, Provisioning, Ready, Degraded, Resharding, Deleting or Failed.",
    "conditions": "SpecValid, Ready, Progressing, ReshardRequired, Resharding, ReshardQueued.",
    "observedGeneration": "The metadata.generation the shards were last applied for.",
    "readyShards": "How many of the shards are ready.",
    "shards": "Per shard: its index, the endpoint clients dial, and whether it is ready.",
    "slotMapEpoch": "Epoch of the slot map the shards route by (1 until a first move).",
    "slotMap": "The committed slot map, once the table was moved online.",
    "lastCheckpoint": "The newest checkpoint every shard wrote (requested or final).",
    "checkpointRequest": "The newest checkpoint asked for on demand (the admin API's request, "
    f"annotation {CHECKPOINT_REQUEST_ANNOTATION}): Running, Completed or Failed with the reason.",
    "migrationJob": "The online move's job record, which a restarted operator resumes from.",
}


def to_structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Convert a pydantic JSON schema into a Kubernetes structural schema."""
    defs = schema.get("$defs", {})
    return _convert(schema, defs)


def _inline(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A ``$ref`` node inlined; the referring node's own keys (default, description) win."""
    if "$ref" not in node:
        return node
    target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
    return {**target, **node}


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _inline(dict(node), defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {len(options)} types structurally")
        node = {**options[0], **node, "nullable": True}
        if node.get("default", ...) is None:
            del node["default"]
        node = _inline(node, defs)  # an optional model (or enum)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS or (key == "additionalProperties" and value is False):
            continue
        if key == "additionalProperties" and value is True:
            if not node.get(_PRESERVE):
                raise ValueError("an open object needs x-kubernetes-preserve-unknown-fields")
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, defs)
        elif key == "patternProperties":  # keys are checked by the models, values here
            (values,) = value.values()
            out["additionalProperties"] = _convert(values, defs)
        else:
            out[key] = copy.deepcopy(value)
    _exclusive_bounds(out)
    if out.get("type") == "object" and isinstance(out.get("default"), dict) and "properties" in out:
        out["default"] = {}  # the server applies the nested defaults itself
    return out


def _exclusive_bounds(node: dict[str, Any]) -> None:
    bounds = (("exclusiveMinimum", "minimum", 1), ("exclusiveMaximum", "maximum", -1))
    for bound, inclusive, step in bounds:
        value = node.get(bound)
        if isinstance(value, bool) or value is None:
            continue
        if node.get("type") == "integer":
            del node[bound]
            node[inclusive] = value + step
        else:
            node[inclusive] = value
            node[bound] = True


def spec_schema() -> dict[str, Any]:
    """The CR ``spec``: every TableSpec field (``name`` optional) plus ``placement``."""
    table = to_structural(TableSpec.model_json_schema(by_alias=True, mode="validation"))
    placement = to_structural(Placement.model_json_schema(by_alias=True, mode="validation"))
    # neither shards nor placement is defaulted by the server: a table on a pool has none
    # (the operator applies the model's defaults to a table of its own)
    table["properties"]["shards"].pop("default", None)
    pool = {"type": "string", "pattern": POOL_NAME.pattern, "maxLength": 63}
    properties = {**table["properties"], "placement": placement, "pool": pool}
    for field, text in _DESCRIPTIONS.items():
        properties[field].setdefault("description", text)
    for path in IMMUTABLE_FIELDS:
        _declare_immutable(properties, [to_camel(part) for part in path])
    return {
        "type": "object",
        "description": table.get("description", ""),
        "required": [f for f in table.get("required", []) if f != "name"],
        "properties": properties,
    }


def _declare_immutable(properties: dict[str, Any], path: list[str]) -> None:
    """A CEL transition rule on the field at ``path``: the API server refuses an update
    that changes it (as the admin API does), instead of the cluster running nodes
    whose declared table no longer matches the rows they keep."""
    node = properties[path[0]]
    for part in path[1:]:
        node = node["properties"][part]
    node["x-kubernetes-validations"] = [
        {
            "rule": "self == oldSelf",
            "message": f"{'.'.join(path)} cannot change once the table exists; create a new table",
        }
    ]


def status_schema() -> dict[str, Any]:
    """The CR ``status``: every EmbeddingTableStatus field. Nothing is required at the top:
    the status is written in parts (the table status, a move's record)."""
    status = to_structural(EmbeddingTableStatus.model_json_schema(by_alias=True, mode="validation"))
    status.pop("required", None)
    for field, text in _STATUS_DESCRIPTIONS.items():
        status["properties"][field].setdefault("description", text)
    return status


def build_crd() -> dict[str, Any]:
    """The EmbeddingTable CustomResourceDefinition."""
    columns = [
        ("Phase", "string", ".status.phase"),
        ("Ready", "integer", ".status.readyShards"),
        ("Shards", "integer", ".spec.shards"),
        ("Pool", "string", ".spec.pool"),
        ("Dim", "integer", ".spec.embeddingDim"),
        ("Rows", "integer", ".spec.numEmbeddings"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    names = (KIND, PLURAL, SINGULAR, SHORT_NAMES)
    schema = {"spec": spec_schema(), "status": status_schema()}
    return crd_object(names, columns, schema, "A sharded, checkpointed embedding table.")


def crd_object(
    names: tuple[str, str, str, tuple[str, ...]],
    columns: list[tuple[str, str, str]],
    schema: dict[str, Any],
    description: str,
) -> dict[str, Any]:
    """A namespaced CRD of the group with a status subresource: ``names`` (kind, plural,
    singular, short names), printer ``columns``, the ``spec`` and ``status`` ``schema``."""
    kind, plural, singular, short_names = names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "recstore"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": ["recstore"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": name, "type": kind, "jsonPath": path}
                        for name, kind, path in columns
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                **schema,
                            },
                        }
                    },
                }
            ],
        },
    }
