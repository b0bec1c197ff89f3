"""The PS pods the operator renders are hardened like every pod the chart installs.

The chart installs the operator, and the operator creates one StatefulSet per table: those
pods run in the same namespaces under the same Pod Security expectations, so they get the
chart's hardening checker, and their security contexts must equal the ones the chart gives
its own pods (a rule tightened in one place must be tightened in the other).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from recstore.core.fleet import METRICS_PORT
from recstore.core.reconcile import parse_declaration
from recstore.operator import render
from recstore.operator.render import Owner, RenderOptions

OWNER = Owner(name="clicks", namespace="recstore", uid="0b9c0d2e-uid")

TABLES = [
    pytest.param({}, None, id="defaults"),
    pytest.param({}, "rel-recstore-ps-token", id="token-secret"),
    pytest.param(
        {"shards": 4, "storage": "gpu", "placement": {"gpus": 1, "spread": "required"}},
        "rel-recstore-ps-token",
        id="gpu",
    ),
    pytest.param(
        {"placement": {"image": "my/ps:9", "storage": {"storageClassName": "ssd"}}},
        None,
        id="custom-image",
    ),
]


def ps_statefulset(spec: dict[str, Any], token_secret: str | None) -> dict[str, Any]:
    decl = parse_declaration({"numEmbeddings": 100, "embeddingDim": 8, **spec}, default_name="t")
    return render.render_statefulset(OWNER, decl, RenderOptions(token_secret=token_secret))


@pytest.mark.parametrize(("spec", "token_secret"), TABLES)
def test_ps_statefulset_passes_the_chart_hardening_checks(spec, token_secret, hardened) -> None:
    hardened(ps_statefulset(spec, token_secret))


@pytest.mark.parametrize(
    "weaken",
    [
        pytest.param(lambda pod: pod.pop("securityContext"), id="no-pod-context"),
        pytest.param(
            lambda pod: pod["containers"][0]["securityContext"].update(
                readOnlyRootFilesystem=False
            ),
            id="writable-root",
        ),
        pytest.param(
            lambda pod: pod["containers"][0]["securityContext"].update(
                capabilities={"drop": ["NET_RAW"]}
            ),
            id="capabilities-kept",
        ),
        pytest.param(
            lambda pod: pod["volumes"].__setitem__(0, {"name": "tmp", "hostPath": {"path": "/t"}}),
            id="tmp-on-host",
        ),
    ],
)
def test_checker_rejects_a_weakened_ps_pod(weaken, hardened) -> None:
    sts = copy.deepcopy(ps_statefulset({}, None))
    weaken(sts["spec"]["template"]["spec"])
    with pytest.raises((AssertionError, KeyError)):
        hardened(sts)


def test_ps_security_contexts_equal_the_charts(chart) -> None:
    manifests = chart.render()
    admin = manifests.one("Deployment", "-admin")  # also uid 10001, like the PS image
    sts = ps_statefulset({}, None)
    ps_pod = manifests.pod_spec(sts)
    assert ps_pod["securityContext"] == manifests.pod_spec(admin)["securityContext"]
    assert (
        manifests.container(sts, "ps")["securityContext"]
        == manifests.container(admin, "admin")["securityContext"]
    )


def test_ps_scrape_annotations_match_the_charts_on_the_metrics_port(chart) -> None:
    admin = chart.render().one("Deployment", "-admin")
    chart_annotations = admin["spec"]["template"]["metadata"]["annotations"]
    ps_annotations = ps_statefulset({}, None)["spec"]["template"]["metadata"]["annotations"]
    assert ps_annotations == {**chart_annotations, "prometheus.io/port": str(METRICS_PORT)}
