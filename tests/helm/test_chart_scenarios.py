"""Every ci/*-values.yaml scenario renders, lints clean and validates strictly.

Each rendered object is checked with `kubernetes-validate --strict` (unknown fields are
errors) against the newest Kubernetes version the package ships. Two kinds have no schema
there: the ServiceMonitor (prometheus-operator's CRD) and the Certificate (cert-manager's) are
checked against small schemas of their own below, and EmbeddingTable resources against the
chart's own CRD.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from recstore.core.resource import API_VERSION, CRD_NAME, POOL_CRD_NAME

EXPECTED_SCENARIOS = {
    "default-values.yaml",
    "external-postgres-values.yaml",
    "bundled-postgres-values.yaml",
    "ingress-servicemonitor-values.yaml",
    "gpu-node-selector-values.yaml",
    "tls-cert-manager-values.yaml",
    "tls-mutual-existing-secret-values.yaml",
    "cluster-wide-values.yaml",
}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
#: kinds kubernetes-validate has no schema for, each validated another way here
OWN_SCHEMA_KINDS = {"ServiceMonitor", "Certificate", "EmbeddingTable"}

_DURATION = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


def _closed(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    """An object schema that refuses any field it does not name (a typo fails validation)."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    schema["properties"] = properties
    return schema


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A closed schema of one object of ``kind``: apiVersion, kind, metadata and ``spec``."""
    metadata = _closed(
        {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STRING_MAP},
        "name",
        "namespace",
    )
    return _closed(
        {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": metadata,
            "spec": spec,
        },
        "apiVersion",
        "kind",
        "metadata",
        "spec",
    )


_SECRET_KEY = _closed({"name": {"type": "string"}, "key": {"type": "string"}}, "name", "key")
#: The part of cert-manager.io/v1 Certificate the chart uses, closed to typos.
CERTIFICATE_SCHEMA = _resource(
    "cert-manager.io/v1",
    "Certificate",
    _closed(
        {
            "secretName": {"type": "string", "minLength": 1},
            "duration": _DURATION,
            "renewBefore": _DURATION,
            "privateKey": _closed(
                {
                    "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                    "size": {"type": "integer"},
                    "rotationPolicy": {"enum": ["Never", "Always"]},
                }
            ),
            "usages": {
                "type": "array",
                "items": {"enum": ["server auth", "client auth", "digital signature"]},
            },
            "dnsNames": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "issuerRef": _closed(
                {
                    "name": {"type": "string", "minLength": 1},
                    "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                    "group": {"type": "string"},
                },
                "name",
            ),
        },
        "secretName",
        "issuerRef",
        "dnsNames",
    ),
)
_SCRAPE_ENDPOINT = _closed(
    {
        "port": {"type": "string"},
        "path": {"type": "string", "pattern": "^/"},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "scheme": {"enum": ["http", "https"]},
        "tlsConfig": _closed(
            {"ca": _closed({"secret": _SECRET_KEY}), "serverName": {"type": "string"}}
        ),
    },
    "port",
)
#: The part of monitoring.coreos.com/v1 ServiceMonitor the chart uses, closed to typos.
SERVICE_MONITOR_SCHEMA = _resource(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    _closed(
        {
            "selector": _closed({"matchLabels": _STRING_MAP}),
            "namespaceSelector": _closed(
                {
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                    "any": {"type": "boolean"},
                }
            ),
            "endpoints": {"type": "array", "minItems": 1, "items": _SCRAPE_ENDPOINT},
        },
        "selector",
        "endpoints",
    ),
)


def _validate_strict(obj: dict[str, Any], kube_version: str) -> None:
    try:
        kubernetes_validate.validate(obj, kube_version, strict=True)
    except kubernetes_validate.ValidationError as err:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        raise AssertionError(f"{name} is invalid for Kubernetes {kube_version}: {err}") from err


def _crd_schema(crds: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    for crd in crds:
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = (v for v in crd["spec"]["versions"] if v.get("storage"))
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    return None


def test_every_expected_scenario_exists(chart) -> None:
    found = {p.name for p in (chart.directory / "ci").glob("*-values.yaml")}
    assert found >= EXPECTED_SCENARIOS


def test_scenario_lints_clean(chart, scenario) -> None:
    _, values = scenario
    report = chart.lint(values)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert report["errors"] == [] and problems == [], problems or report["errors"]


def test_scenario_validates_strictly(chart, scenario) -> None:
    _, values = scenario
    objects = chart.render(values)
    assert objects, "nothing rendered"
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in seen, f"{key} rendered twice"
        seen.add(key)
        assert meta["labels"]["app.kubernetes.io/instance"] == chart.release
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta
        else:
            assert meta["namespace"]
        if obj["kind"] == "ServiceMonitor":
            jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
        elif obj["kind"] == "Certificate":
            jsonschema.validate(obj, CERTIFICATE_SCHEMA)
        elif obj["kind"] != "EmbeddingTable":  # checked against the CRD below
            _validate_strict(obj, chart.kube_version)


def test_tables_installed_by_scenarios_match_the_crd(chart) -> None:
    tables = [
        table
        for path in sorted((chart.directory / "ci").glob("*-values.yaml"))
        for table in chart.render(yaml.safe_load(path.read_text())).find("EmbeddingTable")
    ]
    assert tables, "no scenario installs an EmbeddingTable through values.tables"
    schema = _crd_schema(chart.crds, "EmbeddingTable")
    assert schema is not None, "templates/crd.yaml is missing"
    # A CRD schema is OpenAPI 3.0 (boolean exclusiveMinimum etc.): JSON Schema draft 4 rules.
    validator = jsonschema.Draft4Validator(schema)
    for table in tables:
        assert table["apiVersion"] == API_VERSION
        validator.validate(table)
    broken = copy.deepcopy(tables[0])
    broken["spec"]["embeddingDim"] = 0
    assert not validator.is_valid(broken), "the CRD schema accepts embeddingDim 0"


def test_chart_crds_validate_strictly(chart) -> None:
    crds = chart.crds
    assert crds, "templates/crd.yaml is missing"
    names = {crd["metadata"]["name"] for crd in crds}
    assert {CRD_NAME, POOL_CRD_NAME} <= names
    for crd in crds:
        _validate_strict(crd, chart.kube_version)


def test_the_example_pool_and_its_table_match_the_chart_crds(chart) -> None:
    """examples/tables/pool: the EmbeddingPool and a table placed on it, as the API server
    installed by the chart takes them; a pool with shards 0 it refuses."""
    examples = chart.directory.parents[1] / "examples/tables/pool"
    objects = [yaml.safe_load(p.read_text()) for p in sorted(examples.glob("*.yaml"))]
    assert sorted(o["kind"] for o in objects) == ["EmbeddingPool", "EmbeddingTable"]
    for obj in objects:
        schema = _crd_schema(chart.crds, obj["kind"])
        assert schema is not None, f"no CRD for {obj['kind']}"
        jsonschema.Draft4Validator(schema).validate(obj)
    pool = next(o for o in objects if o["kind"] == "EmbeddingPool")
    broken = copy.deepcopy(pool)
    broken["spec"]["shards"] = 0
    schema = _crd_schema(chart.crds, "EmbeddingPool")
    assert schema is not None
    assert not jsonschema.Draft4Validator(schema).is_valid(broken)


def test_strict_validation_rejects_an_unknown_field(chart) -> None:
    """The check above can fail: a misspelt field in a rendered object is caught."""
    deployment = chart.render().one("Deployment", "-admin")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(AssertionError, match="imagePullPolicyy"):
        _validate_strict(broken, chart.kube_version)


def test_service_monitor_schema_rejects_a_typo() -> None:
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m", "namespace": "n"},
        "spec": {
            "selector": {"matchLabels": {}},
            "endpoints": [{"port": "http", "intervall": "5s"}],
        },
    }
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
