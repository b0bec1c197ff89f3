"""values.schema.json turns bad values into a clear error before anything renders.

Helm validates the merged values against the schema on install, upgrade, template and lint;
each row below is a mistake a user could make, and the message must name the key.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from helm_python.errors import HelmValuesError

BAD_VALUES = [
    # unknown keys: typos at the top level and inside closed objects
    ({"replicas": 2}, "additional properties 'replicas' not allowed"),
    ({"admin": {"replica": 2}}, "at '/admin': additional properties 'replica' not allowed"),
    ({"postgresql": {"enable": True}}, "additional properties 'enable' not allowed"),
    # wrong types
    ({"admin": {"replicas": "3"}}, "at '/admin/replicas': got string, want integer"),
    ({"admin": {"replicas": 1.5}}, "at '/admin/replicas'"),
    ({"postgresql": {"enabled": "yes"}}, "at '/postgresql/enabled': got string, want boolean"),
    (
        {"operator": {"watchNamespaces": "ml"}},
        "at '/operator/watchNamespaces': got string, want array",
    ),
    (
        {"admin": {"nodeSelector": {"gpu": True}}},
        "at '/admin/nodeSelector/gpu': got boolean, want string",
    ),
    (
        {"operator": {"extraEnv": [{"value": "x"}]}},
        "at '/operator/extraEnv/0': missing property 'name'",
    ),
    # out of range
    ({"admin": {"replicas": -1}}, "at '/admin/replicas': minimum: got -1, want 0"),
    ({"admin": {"service": {"port": 70000}}}, "at '/admin/service/port': maximum: got 70,000"),
    ({"admin": {"service": {"type": "ExternalName"}}}, "at '/admin/service/type'"),
    ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
    # malformed strings
    ({"image": {"registry": "ghcr.io/acme"}}, "at '/image/registry'"),
    ({"operator": {"watchNamespaces": ["Team_A"]}}, "at '/operator/watchNamespaces/0'"),
    ({"operator": {"watchNamespaces": ["ml", "ml"]}}, "at '/operator/watchNamespaces'"),
    ({"postgresql": {"persistence": {"size": "lots"}}}, "at '/postgresql/persistence/size'"),
    (
        {"metrics": {"serviceMonitor": {"interval": "soon"}}},
        "at '/metrics/serviceMonitor/interval'",
    ),
    ({"postgresql": {"username": "drop table"}}, "at '/postgresql/username'"),
    (
        {
            "admin": {
                "ingress": {
                    "hosts": [{"host": "a", "paths": [{"path": "x", "pathType": "Prefix"}]}]
                }
            }
        },
        "at '/admin/ingress/hosts/0/paths/0/path'",
    ),
    # incomplete entries
    ({"tables": [{"name": "t"}]}, "at '/tables/0': missing property 'spec'"),
    ({"tables": [{"name": "item_emb", "spec": {}}]}, "at '/tables/0/name'"),  # not a DNS label
    ({"tables": [{"name": "t" * 50, "spec": {}}]}, "at '/tables/0/name'"),  # names pods: <= 49
    ({"tables": [{"name": "t", "spec": {"embeddingDim": 8}}]}, "missing property 'numEmbeddings'"),
    ({"operator": {"image": {"repository": ""}}}, "at '/operator/image/repository'"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_bad_values_are_refused_with_the_key_named(chart, values: dict, message: str) -> None:
    with pytest.raises(HelmValuesError, match=re.escape(message)):
        chart.render(values)
    report = chart.lint(values)  # `helm lint -f` reports the same error
    assert any(message in error for error in report["errors"]), report["errors"]


@pytest.mark.parametrize(
    "values",
    [
        {"admin": {"replicas": 0}},
        {"admin": {"service": {"type": "LoadBalancer", "port": 443}}},
        {"image": {"registry": "registry.example.com:5000/team/"}},
        {"operator": {"extraEnv": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}},
        {"postgresql": {"enabled": True, "persistence": {"size": "512Mi"}}},
        {"global": {"imageRegistry": "x"}},
    ],
)
def test_good_values_pass_the_schema(chart, values: dict) -> None:
    chart.loaded.validate_schema(chart.loaded.merge_values(values))
    assert chart.render(values)


def _leaf_paths(node: Any, prefix: str = "") -> set[str]:
    if isinstance(node, dict) and node:
        return {p for key, value in node.items() for p in _leaf_paths(value, f"{prefix}/{key}")}
    return {prefix}


def _schema_allows(schema: dict[str, Any], path: str) -> bool:
    node = schema
    for key in path.strip("/").split("/"):
        if "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
        properties = node.get("properties", {})
        if key in properties:
            node = properties[key]
        else:  # not a listed key: allowed only by a free-form map (labels, resources)
            return node.get("additionalProperties", True) is not False
    return True


def _uncommented_values(text: str) -> list[str]:
    """Keys of values.yaml that hold a value but have no comment line right above them.

    A section (a key whose children follow) needs no comment of its own; everything inside a
    commented value (e.g. the default `resources`) is part of that value."""
    missing: list[str] = []
    ancestors: list[tuple[int, bool]] = []  # (indent, commented) of the enclosing keys
    lines = text.splitlines()
    for number, raw in enumerate(lines):
        line = raw.replace("- ", "  ", 1) if raw.lstrip().startswith("- ") else raw
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):(.*)$", line)
        if not match:
            continue
        indent, rest = len(match.group(1)), match.group(3).strip()
        while ancestors and ancestors[-1][0] >= indent:
            ancestors.pop()
        commented = number > 0 and lines[number - 1].strip().startswith("#")
        if any(c for _, c in ancestors):
            continue
        if rest == "":  # a section: its children carry the comments
            ancestors.append((indent, commented))
        elif not commented:
            missing.append(f"line {number + 1}: {raw.strip()}")
    return missing


def test_every_value_is_commented(chart) -> None:
    text = (chart.directory / "values.yaml").read_text()
    assert _uncommented_values(text) == []
    assert _uncommented_values("a:\n  b: 1\n# c\nc: 2\n") == ["line 2: b: 1"]  # can fail


def test_schema_covers_every_default_value(chart) -> None:
    schema = json.loads((chart.directory / "values.schema.json").read_text())
    defaults = yaml.safe_load((chart.directory / "values.yaml").read_text())
    for path in _leaf_paths(defaults):
        assert _schema_allows(schema, path), f"values.yaml has {path}, the schema refuses it"


def _schema_paths(node: dict[str, Any], prefix: str = "") -> set[str]:
    """Paths of the keys the schema declares inline (not inside shared definitions)."""
    paths: set[str] = set()
    for key, sub in node.get("properties", {}).items():
        paths.add(f"{prefix}/{key}")
        paths |= _schema_paths(sub, f"{prefix}/{key}")
    return paths


def test_schema_declares_no_value_that_values_yaml_lacks(chart) -> None:
    """A key left in the schema after its value was removed would be silently accepted."""
    schema = json.loads((chart.directory / "values.schema.json").read_text())
    defaults = yaml.safe_load((chart.directory / "values.yaml").read_text())
    for path in _schema_paths(schema) - {"/global"}:
        node: Any = defaults
        for key in path.strip("/").split("/"):
            assert isinstance(node, dict) and key in node, f"schema has {path}, values.yaml not"
            node = node[key]
