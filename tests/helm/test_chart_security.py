"""Every pod the chart creates runs hardened, in every scenario.

Non-root, read-only root filesystem, no privilege escalation, no capabilities, the
RuntimeDefault seccomp profile; whatever must be writable (/tmp, data) is a mounted volume;
the API token is mounted only into pods that talk to the Kubernetes API; no host access.
The checker itself is the ``hardened`` fixture (conftest.py): the operator's PS pods are held
to the same rules in test_operator_pods.py.
"""

from __future__ import annotations

import pytest


def test_every_workload_is_hardened(chart, scenario, hardened) -> None:
    _, values = scenario
    manifests = chart.render(values)
    workloads = manifests.workloads()
    assert workloads
    for workload in workloads:
        hardened(workload)


def test_bundled_postgresql_is_hardened_with_writable_runtime_dirs(chart, hardened) -> None:
    manifests = chart.render({"postgresql": {"enabled": True}})
    statefulset = manifests.one("StatefulSet", "-postgresql")
    hardened(statefulset)
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
