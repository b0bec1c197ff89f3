"""Offline rendering of the Helm chart, shared by the chart tests.

There is no kube-apiserver and no helm binary here: helm-python-sdk runs Helm's own
template engine and linter in-process, and kubernetes-validate checks every rendered object
against the real Kubernetes OpenAPI schemas. Test modules cannot import each other or a
helper module under --import-mode=importlib, so the helpers travel as fixtures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "recstore"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
RELEASE = "rel"
NAMESPACE = "recstore"

Manifest = dict[str, Any]


class Manifests(list[Manifest]):
    """Rendered objects, with the look-ups the tests use."""

    def find(self, kind: str, name_suffix: str = "") -> list[Manifest]:
        """Objects of one kind whose name ends with name_suffix."""
        return [
            o for o in self if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)
        ]

    def one(self, kind: str, name_suffix: str = "") -> Manifest:
        found = self.find(kind, name_suffix)
        assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {len(found)}"
        return found[0]

    def workloads(self) -> list[Manifest]:
        return [o for o in self if o["kind"] in ("Deployment", "StatefulSet")]

    @staticmethod
    def pod_spec(workload: Manifest) -> dict[str, Any]:
        spec: dict[str, Any] = workload["spec"]["template"]["spec"]
        return spec

    @classmethod
    def container(cls, workload: Manifest, name: str) -> dict[str, Any]:
        (found,) = (c for c in cls.pod_spec(workload)["containers"] if c["name"] == name)
        return found

    @staticmethod
    def env(container_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Environment variables by name (each the full EnvVar object)."""
        return {e["name"]: e for e in container_spec.get("env", [])}


class RenderedChart:
    """The chart, loaded once; renders values into parsed Kubernetes objects."""

    directory = CHART_DIR
    release = RELEASE
    namespace = NAMESPACE
    #: the newest Kubernetes release kubernetes-validate ships schemas for
    kube_version = str(kubernetes_validate.latest_version())

    def __init__(self, loaded: helm.Chart) -> None:
        self.loaded = loaded

    def render_files(self, values: dict[str, Any] | None = None) -> dict[str, str]:
        return self.loaded.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)

    def render(self, values: dict[str, Any] | None = None) -> Manifests:
        files = self.render_files(values)
        return Manifests(
            doc
            for path, text in sorted(files.items())
            if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text)
            if doc
        )

    def notes(self, values: dict[str, Any] | None = None) -> str:
        files = self.render_files(values)
        (notes,) = (text for path, text in files.items() if path.endswith("NOTES.txt"))
        return notes

    def lint(self, values: dict[str, Any] | None = None) -> dict[str, Any]:
        return helm.lint(
            CHART_DIR, values or {}, namespace=NAMESPACE, kube_version=f"v{self.kube_version}"
        )

    @property
    def crds(self) -> list[Manifest]:
        """The CRDs the chart installs: templates (``helm upgrade`` upgrades them), not crds/."""
        assert not self.loaded.crds, "a crds/ folder is never upgraded by helm upgrade"
        return self.render().find("CustomResourceDefinition")


#: securityContext fields every container of every pod must carry, with their values.
CONTAINER_HARDENING = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "privileged": False,
}
WRITABLE_VOLUME_KINDS = ("emptyDir", "persistentVolumeClaim")


def check_hardened(workload: Manifest) -> None:
    """Assert a Deployment or StatefulSet runs hardened (the rules in test_chart_security).

    Shared by the chart's workloads and the StatefulSets the operator renders for tables.
    """
    name = workload["metadata"]["name"]
    pod = Manifests.pod_spec(workload)
    pod_ctx = pod["securityContext"]
    assert pod_ctx["runAsNonRoot"] is True, name
    assert pod_ctx["runAsUser"] > 0 and pod_ctx["runAsGroup"] > 0, name
    assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), f"{name}: {key}"
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    for volume in volumes.values():
        assert "hostPath" not in volume, f"{name}: hostPath volume {volume['name']}"
    for c in list(pod.get("initContainers", [])) + list(pod["containers"]):
        where = f"{name}/{c['name']}"
        ctx = c["securityContext"]
        for key, expected in CONTAINER_HARDENING.items():
            assert ctx.get(key) is expected, f"{where}: securityContext.{key}"
        assert ctx["capabilities"] == {"drop": ["ALL"]}, where
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert "resources" in c and c["resources"].get("requests"), f"{where}: no requests"
        for mount in c.get("volumeMounts", []):
            if mount.get("readOnly"):
                continue
            writable = mount["name"] in claims or any(
                kind in volumes.get(mount["name"], {}) for kind in WRITABLE_VOLUME_KINDS
            )
            assert writable, f"{where}: writable mount {mount['mountPath']} is not a volume"
    if pod["containers"][0]["name"] != "postgresql":  # Python services write temp files
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert "/tmp" in mounts, f"{name}: no /tmp mount"
        assert "emptyDir" in volumes[mounts["/tmp"]], f"{name}: /tmp is not an emptyDir"


@pytest.fixture(scope="session")
def hardened() -> Callable[[Manifest], None]:
    """The hardening checker (test modules cannot import it from here)."""
    return check_hardened


def load_values(path: Path) -> dict[str, Any]:
    values = yaml.safe_load(path.read_text()) or {}
    assert isinstance(values, dict), f"{path.name} must hold a mapping"
    return values


@pytest.fixture(scope="session")
def chart() -> Iterator[RenderedChart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield RenderedChart(loaded)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`scenario` is each ci/*-values.yaml file as (name, values)."""
    if "scenario" in metafunc.fixturenames:
        metafunc.parametrize(
            "scenario",
            [(p.name, load_values(p)) for p in CI_VALUES],
            ids=[p.name.removesuffix("-values.yaml") for p in CI_VALUES],
        )
