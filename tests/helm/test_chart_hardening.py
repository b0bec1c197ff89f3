"""What the chart does for TLS, NetworkPolicies, the image allow-list, the operator's own
token and the CRD: each value's effect on the rendered objects, and that the operator reads
what the chart gives it (same paths, same variables)."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

import pytest
from helm_python.errors import HelmRenderError

from recstore.core.resource import CRD_NAME, POOL_CRD_NAME

TLS = {"tls": {"enabled": True, "existingSecret": "my-tls"}}


def _deployment(manifests, component: str) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = manifests.one("Deployment", f"-{component}")
    return deployment, manifests.container(deployment, component)


def _plain_env(manifests, container: dict[str, Any]) -> dict[str, str]:
    return {k: e["value"] for k, e in manifests.env(container).items() if "value" in e}


# --- NetworkPolicies ------------------------------------------------------------------------


def _peers(policy: dict[str, Any], port: str) -> list[dict[str, Any]]:
    (rule,) = (r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == port)
    peers: list[dict[str, Any]] = rule["from"]
    return peers


def test_ps_pods_are_reachable_only_from_the_operator_admin_and_trainers(chart) -> None:
    render = importlib.import_module("recstore.operator.render")
    manifests = chart.render({"operator": {"watchNamespaces": ["ml", "recstore"]}})
    policies = manifests.find("NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["ml", "recstore"]
    owner = render.Owner(name="t", namespace="ml", uid="u")
    pod_labels = render.labels(owner)
    container_ports = {"grpc", "metrics"}
    for policy in policies:
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
        assert {r["ports"][0]["port"] for r in spec["ingress"]} == container_ports
        release_ns = {"matchLabels": {"kubernetes.io/metadata.name": "recstore"}}
        grpc = _peers(policy, "grpc")
        components = [
            p["podSelector"]["matchLabels"].get("app.kubernetes.io/component") for p in grpc
        ]
        assert components == ["operator", "admin", None]
        assert all(p["namespaceSelector"] == release_ns for p in grpc[:2])
        assert grpc[2] == {"podSelector": {"matchLabels": {"recstore.io/trainer": "true"}}}
        (scraper,) = _peers(policy, "metrics")  # the admin API's dashboard scrapes them
        assert scraper["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "admin"
    # the operator and admin pods carry the labels the policy admits
    for component in ("operator", "admin"):
        deployment, _ = _deployment(manifests, component)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        wanted = next(
            p["podSelector"]["matchLabels"]
            for p in _peers(policies[0], "grpc")
            if p["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == component
        )
        assert wanted.items() <= labels.items()


def test_network_policy_values(chart) -> None:
    manifests = chart.render(
        {
            "networkPolicy": {
                # Helm merges maps with the defaults: null drops the default label
                "trainerPodLabels": {"recstore.io/trainer": None, "team": "ranking"},
                "trainerNamespaceLabels": {"trainers": "yes"},
                "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            }
        }
    )
    (policy,) = manifests.find("NetworkPolicy")
    assert _peers(policy, "grpc")[2:] == [
        {"podSelector": {"matchLabels": {"team": "ranking"}}},
        {
            "namespaceSelector": {"matchLabels": {"trainers": "yes"}},
            "podSelector": {"matchLabels": {"team": "ranking"}},
        },
    ]
    assert _peers(policy, "metrics")[1] == {
        "namespaceSelector": {"matchLabels": {"name": "monitoring"}}
    }
    assert chart.render({"networkPolicy": {"enabled": False}}).find("NetworkPolicy") == []


# --- TLS ------------------------------------------------------------------------------------


def test_tls_is_off_by_default(chart) -> None:
    manifests = chart.render()
    _, admin = _deployment(manifests, "admin")
    _, operator = _deployment(manifests, "operator")
    assert not any(a.startswith("--tls") for a in admin["args"])
    assert not any(
        k.startswith(("RECSTORE_TLS", "RECSTORE_PS_TLS")) for k in manifests.env(operator)
    )
    assert _plain_env(manifests, operator)["RECSTORE_ADMIN_URL"].startswith("http://")


@pytest.mark.parametrize("mutual", [False, True])
def test_tls_secret_serves_the_admin_api_and_reaches_the_operator(
    chart, mutual: bool, tmp_path: Path, tls_files
) -> None:
    render = importlib.import_module("recstore.operator.render")
    config_module = importlib.import_module("recstore.operator.config")
    manifests = chart.render({"tls": {**TLS["tls"], "mutual": mutual}})
    admin_deployment, admin = _deployment(manifests, "admin")
    admin_volumes = {v["name"]: v for v in manifests.pod_spec(admin_deployment)["volumes"]}
    assert admin_volumes["tls"]["secret"]["secretName"] == "my-tls"
    tls_dir = next(m["mountPath"] for m in admin["volumeMounts"] if m["name"] == "tls")
    assert tls_dir == render.TLS_DIR  # the chart's pods and the operator's PS pods agree
    args = admin["args"]
    assert args[args.index("--tls-cert") + 1] == f"{tls_dir}/tls.crt"
    assert args[args.index("--tls-key") + 1] == f"{tls_dir}/tls.key"
    for probe in ("readinessProbe", "livenessProbe"):
        assert admin[probe]["httpGet"]["scheme"] == "HTTPS"

    operator_deployment, operator = _deployment(manifests, "operator")
    env = _plain_env(manifests, operator)
    assert env["RECSTORE_ADMIN_URL"] == "https://rel-recstore-admin.recstore.svc:8080"
    assert env["RECSTORE_PS_TLS_SECRET"] == "my-tls"
    assert env["RECSTORE_TLS_CA"] == f"{tls_dir}/ca.crt"
    assert env["RECSTORE_TLS_SERVER_NAME"] == "recstore-ps"
    assert ("RECSTORE_TLS_CERT" in env) is mutual and ("RECSTORE_TLS_KEY" in env) is mutual
    mounts = {m["name"]: m["mountPath"] for m in operator["volumeMounts"]}
    volumes = {v["name"]: v for v in manifests.pod_spec(operator_deployment)["volumes"]}
    assert mounts["tls"] == tls_dir and volumes["tls"]["secret"]["secretName"] == "my-tls"
    # What the operator makes of it, with a Secret of that layout where the pod mounts it.
    mounted = tmp_path / "tls"
    mounted.mkdir()
    for key, source in (("ca.crt", "ca"), ("tls.crt", "client_cert"), ("tls.key", "client_key")):
        shutil.copy(getattr(tls_files, source), mounted / key)
    in_pod = {k: v.replace(tls_dir, str(mounted)) for k, v in env.items()}
    config = config_module.OperatorConfig.from_env(in_pod)
    assert (config.ps_tls_secret, config.ps_tls_mutual) == ("my-tls", mutual)
    assert config.tls is not None and config.tls.server_name == "recstore-ps"
    assert (config.tls.cert is not None) is mutual


def test_cert_manager_writes_the_secret_in_every_served_namespace(chart) -> None:
    values = {
        "tls": {
            "enabled": True,
            "certManager": {"enabled": True, "issuerRef": {"name": "internal-ca"}},
        },
        "operator": {"watchNamespaces": ["ml"]},
    }
    manifests = chart.render(values)
    certificates = manifests.find("Certificate")
    assert sorted(c["metadata"]["namespace"] for c in certificates) == ["ml", "recstore"]
    _, operator = _deployment(manifests, "operator")
    secret = _plain_env(manifests, operator)["RECSTORE_PS_TLS_SECRET"]
    assert secret == "rel-recstore-tls"
    for certificate in certificates:
        spec = certificate["spec"]
        assert spec["secretName"] == secret
        assert spec["issuerRef"] == {
            "name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"
        }  # fmt: skip
        assert "recstore-ps" in spec["dnsNames"]  # the name clients check the PS nodes by
        assert "rel-recstore-admin.recstore.svc" in spec["dnsNames"]
        assert set(spec["usages"]) == {"server auth", "client auth"}
    unnamed = {"tls": {"enabled": True, "certManager": {"enabled": True}}}
    with pytest.raises(HelmRenderError, match=r"issuerRef\.name"):
        chart.render(unnamed)


# --- images, tokens, CRD --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "expected"), [([], ""), (["a/ps:*", "b/ps:1"], "a/ps:*,b/ps:1")]
)
def test_the_image_allow_list_reaches_the_operator(chart, allowed: list, expected: str) -> None:
    config_module = importlib.import_module("recstore.operator.config")
    manifests = chart.render({"images": {"allowed": allowed}})
    _, operator = _deployment(manifests, "operator")
    env = _plain_env(manifests, operator)
    assert env["RECSTORE_ALLOWED_IMAGES"] == expected
    config = config_module.OperatorConfig.from_env(env)
    assert config.image_problem(env["RECSTORE_PS_IMAGE"]) is None  # the chart's image
    assert config.image_problem("evil.example/miner:1") is not None


def test_the_operator_never_gets_the_bootstrap_admin_token(chart, scenario) -> None:
    _, values = scenario
    manifests = chart.render(values)
    deployment, operator = _deployment(manifests, "operator")
    bootstrap = {s["metadata"]["name"] for s in manifests.find("Secret", "-admin-token")}
    bootstrap.add(values.get("auth", {}).get("bootstrapToken", {}).get("existingSecret", ""))
    referenced = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in operator.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    referenced |= {
        v["secret"]["secretName"]
        for v in manifests.pod_spec(deployment)["volumes"]
        if "secret" in v
    }
    assert not referenced & bootstrap


def test_the_crd_is_a_template_that_upgrades_and_survives_uninstall(chart) -> None:
    crds = chart.render().find("CustomResourceDefinition")
    assert sorted(crd["metadata"]["name"] for crd in crds) == sorted([CRD_NAME, POOL_CRD_NAME])
    for crd in crds:
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert not chart.loaded.crds  # crds/ is installed once and never upgraded
    assert chart.render({"crds": {"install": False}}).find("CustomResourceDefinition") == []
