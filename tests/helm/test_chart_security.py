"""Every pod the chart creates runs hardened, in every scenario.

Non-root, read-only root filesystem, no privilege escalation, no capabilities, the
RuntimeDefault seccomp profile; whatever must be writable (/tmp, data) is a mounted volume;
the API token is mounted only into pods that talk to the Kubernetes API; no host access.
"""

from __future__ import annotations

from typing import Any

import pytest

CONTAINER_HARDENING = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "privileged": False,
}
WRITABLE_VOLUME_KINDS = ("emptyDir", "persistentVolumeClaim")


def _all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod.get("initContainers", [])) + list(pod["containers"])


def _check_workload(manifests, workload: dict[str, Any]) -> None:
    name = workload["metadata"]["name"]
    pod = manifests.pod_spec(workload)
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
    for c in _all_containers(pod):
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
        assert "emptyDir" in volumes[mounts["/tmp"]], f"{name}: /tmp is not an emptyDir"


def test_every_workload_is_hardened(chart, scenario) -> None:
    _, values = scenario
    manifests = chart.render(values)
    workloads = manifests.workloads()
    assert workloads
    for workload in workloads:
        _check_workload(manifests, workload)


def test_bundled_postgresql_is_hardened_with_writable_runtime_dirs(chart) -> None:
    manifests = chart.render({"postgresql": {"enabled": True}})
    statefulset = manifests.one("StatefulSet", "-postgresql")
    _check_workload(manifests, statefulset)
    pod = manifests.pod_spec(statefulset)
    assert pod["securityContext"]["runAsUser"] == 999  # the official image's postgres user
    mounts = {
        m["mountPath"] for m in manifests.container(statefulset, "postgresql")["volumeMounts"]
    }
    assert {"/var/lib/postgresql/data", "/var/run/postgresql", "/tmp"} <= mounts


@pytest.mark.parametrize(
    ("kubernetes_enabled", "admin_mounts_token"), [(True, True), (False, False)]
)
def test_api_token_is_mounted_only_where_the_api_is_used(
    chart, kubernetes_enabled: bool, admin_mounts_token: bool
) -> None:
    manifests = chart.render(
        {"postgresql": {"enabled": True}, "admin": {"kubernetes": {"enabled": kubernetes_enabled}}}
    )
    automount = {
        w["metadata"]["name"].rsplit("-", 1)[-1]: manifests.pod_spec(w)[
            "automountServiceAccountToken"
        ]
        for w in manifests.workloads()
    }
    assert automount == {"operator": True, "admin": admin_mounts_token, "postgresql": False}
