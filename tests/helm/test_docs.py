"""docs/kubernetes.md stays true to the chart: its commands, values and manifests work.

Every `--set` in the install instructions renders through the chart, every key in the values
table exists in values.yaml, and every YAML manifest shown validates strictly.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
HEADINGS = [
    "## Install",
    "## Values",
    "## Using a table from a training job",
    "## EmbeddingTable",
    "## Status and phases",
    "## What the operator creates",
]


def _chart_sections() -> str:
    """The sections about the chart (the operator's sections are checked by its tests)."""
    text = DOC.read_text()
    return text[text.index("## Install") : text.index("## EmbeddingTable")]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _chart_sections(), flags=re.S)


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def test_sections_are_in_order() -> None:
    lines = [line for line in DOC.read_text().splitlines() if line.startswith("## ")]
    assert [h for h in lines if h in HEADINGS] == HEADINGS


def test_every_documented_set_flag_renders(chart) -> None:
    commands = " ".join(_blocks("sh")).replace("\\\n", " ")
    for command in re.findall(r"helm (?:install|upgrade)[^\n]*", commands):
        values: dict[str, Any] = {}
        for expression in re.findall(r"--set (\S+)", command):
            _merge(values, helm.parse_set_string(expression))
        assert chart.render(values), command


def test_values_table_names_real_values(chart) -> None:
    defaults = chart.loaded.values
    keys = re.findall(r"^\| `([a-zA-Z.*]+)`", _chart_sections(), flags=re.M)
    assert len(keys) > 10
    for key in keys:
        node: Any = defaults
        for part in key.split(" ")[0].split("."):
            if part == "*":
                break
            assert isinstance(node, dict) and part in node, f"docs name unknown value {key}"
            node = node[part]


def test_documented_manifests_validate_strictly(chart) -> None:
    manifests = [doc for block in _blocks("yaml") for doc in yaml.safe_load_all(block) if doc]
    kinds = {m["kind"] for m in manifests}
    assert "Job" in kinds
    for manifest in manifests:
        kubernetes_validate.validate(manifest, chart.kube_version, strict=True)


def test_training_job_uses_the_variables_the_sdk_reads(chart) -> None:
    discovery = importlib.import_module("recstore.client.remote.tables")
    grpc_backend = importlib.import_module("recstore.client.remote.backend")
    wanted = {discovery.ADMIN_URL_ENV, discovery.TOKEN_ENV, grpc_backend.PS_TOKEN_ENV}
    (job,) = (
        doc
        for block in _blocks("yaml")
        for doc in yaml.safe_load_all(block)
        if doc and doc["kind"] == "Job"
    )
    env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env == wanted
    assert grpc_backend.PS_TOKEN_ENV in chart.notes()
