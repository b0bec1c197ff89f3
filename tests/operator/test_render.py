"""Rendered children: parameter tables over placements, each object schema-checked offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from recstore.core.reconcile import parse_declaration
from recstore.operator import render
from recstore.operator.render import Owner, RenderOptions
from recstore.operator.status import observe, statefulset_rolling

K8S_VERSION = kubernetes_validate.utils.latest_version()
OWNER = Owner(name="clicks", namespace="ml", uid="0b9c0d2e-uid")
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples/tables").glob("*.yaml"))


def decl(**spec: Any):
    return parse_declaration({"numEmbeddings": 100, "embeddingDim": 8, **spec}, default_name="t")


def container(sts: dict[str, Any]) -> dict[str, Any]:
    return sts["spec"]["template"]["spec"]["containers"][0]


def all_children(d, options: RenderOptions | None = None) -> list[dict[str, Any]]:
    options = options or RenderOptions()
    return [
        render.render_statefulset(OWNER, d, options),
        render.render_service(OWNER),
        render.render_pdb(OWNER),
    ]


PLACEMENTS = [
    pytest.param({}, id="defaults"),
    pytest.param({"shards": 4, "storage": "gpu", "placement": {"gpus": 2}}, id="gpus"),
    pytest.param(
        {
            "placement": {
                "nodeSelector": {"pool": "recsys"},
                "spread": "required",
                "tolerations": [
                    {
                        "key": "k",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 30,
                    }
                ],
                "resources": {
                    "cpu": "500m",
                    "memory": "1Gi",
                    "cpuLimit": "2",
                    "memoryLimit": "2Gi",
                },
                "storage": {"size": "1Ti", "storageClassName": "ssd", "retainOnDelete": False},
            }
        },
        id="constrained",
    ),
    pytest.param({"placement": {"spread": "none", "image": "my/ps:9"}}, id="no-spread"),
]


@pytest.mark.parametrize("spec", PLACEMENTS)
@pytest.mark.parametrize("token_secret", [None, "ps-token"])
def test_children_pass_strict_kubernetes_validation(spec, token_secret):
    for obj in all_children(decl(**spec), RenderOptions(token_secret=token_secret)):
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_validator_is_not_vacuous():
    sts = render.render_statefulset(OWNER, decl(), RenderOptions())
    sts["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
    sts = render.render_statefulset(OWNER, decl(), RenderOptions())
    container(sts)["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("spec", "requests", "limits"),
    [
        ({}, {"cpu": "1", "memory": "2Gi"}, {"memory": "2Gi"}),
        (
            {"storage": "gpu", "placement": {"gpus": 2, "resources": {"cpuLimit": "4"}}},
            {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "2"},
            {"memory": "2Gi", "cpu": "4", "nvidia.com/gpu": "2"},
        ),
        (
            {"placement": {"resources": {"memory": "8Gi", "memoryLimit": "10Gi"}}},
            {"cpu": "1", "memory": "8Gi"},
            {"memory": "10Gi"},
        ),
    ],
)
def test_resources(spec, requests, limits):
    res = container(render.render_statefulset(OWNER, decl(**spec), RenderOptions()))["resources"]
    assert res == {"requests": requests, "limits": limits}


@pytest.mark.parametrize(
    ("gpus", "device", "gpu_toleration"), [(0, "cpu", False), (1, "cuda", True)]
)
def test_device_and_gpu_toleration(gpus, device, gpu_toleration):
    spec = {"storage": "gpu" if gpus else "host", "placement": {"gpus": gpus}}
    sts = render.render_statefulset(OWNER, decl(**spec), RenderOptions())
    args = container(sts)["args"]
    assert args[args.index("--device") + 1] == device
    tolerations = sts["spec"]["template"]["spec"].get("tolerations", [])
    assert any(t.get("key") == "nvidia.com/gpu" for t in tolerations) == gpu_toleration


def test_statefulset_wiring():
    sts = render.render_statefulset(
        OWNER, decl(shards=3), RenderOptions(default_image="img:1", token_secret="tok")
    )
    c = container(sts)
    assert sts["metadata"]["name"] == sts["spec"]["serviceName"] == "clicks-ps"
    assert sts["spec"]["replicas"] == 3
    assert c["command"] == ["recstore"] and c["image"] == "img:1"
    assert c["args"][c["args"].index("--shard-index") + 1] == "$(RECSTORE_SHARD_INDEX)"
    assert c["args"][c["args"].index("--num-shards") + 1] == "3"
    assert c["args"][-2:] == ["--auth-token-file", "/var/run/secrets/recstore/token"]
    (env,) = [e for e in c["env"] if e["name"] == "RECSTORE_SHARD_INDEX"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    for probe in ("readinessProbe", "startupProbe"):
        assert c[probe]["grpc"] == {"port": 50051}
    # a node whose log failed is not ready (no writes) but alive (reads): never restarted
    assert c["livenessProbe"]["grpc"] == {"port": 50051, "service": "liveness"}
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    selector = sts["spec"]["selector"]["matchLabels"]
    assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == "tok"
    assert {"name": "token", "mountPath": "/var/run/secrets/recstore", "readOnly": True} in (
        c["volumeMounts"]
    )


def pod_spec(sts: dict[str, Any]) -> dict[str, Any]:
    return sts["spec"]["template"]["spec"]


# The recstore-ps image runs as uid 10001 (docker/ps-node.Dockerfile); a fresh data PVC is
# root-owned, so the pod's fsGroup must be that group for the node to write checkpoints/WAL.
POD_SECURITY = [
    ("runAsNonRoot", True),
    ("runAsUser", 10001),
    ("runAsGroup", 10001),
    ("fsGroup", 10001),
    ("fsGroupChangePolicy", "OnRootMismatch"),
    ("seccompProfile", {"type": "RuntimeDefault"}),
]
CONTAINER_SECURITY = [
    ("readOnlyRootFilesystem", True),
    ("allowPrivilegeEscalation", False),
    ("capabilities", {"drop": ["ALL"]}),
    ("runAsNonRoot", True),
    ("privileged", False),
]
SCRAPE_ANNOTATIONS = [
    ("prometheus.io/scrape", "true"),
    ("prometheus.io/port", "9100"),
    ("prometheus.io/path", "/metrics"),
]


@pytest.mark.parametrize("spec", PLACEMENTS)
@pytest.mark.parametrize(("field", "expected"), POD_SECURITY)
def test_pod_security_context(spec, field, expected):
    sts = render.render_statefulset(OWNER, decl(**spec), RenderOptions(token_secret="tok"))
    assert pod_spec(sts)["securityContext"][field] == expected


@pytest.mark.parametrize("spec", PLACEMENTS)
@pytest.mark.parametrize(("field", "expected"), CONTAINER_SECURITY)
def test_container_security_context(spec, field, expected):
    sts = render.render_statefulset(OWNER, decl(**spec), RenderOptions(token_secret="tok"))
    assert container(sts)["securityContext"][field] == expected


@pytest.mark.parametrize(("annotation", "expected"), SCRAPE_ANNOTATIONS)
def test_pod_scrape_annotations(annotation, expected):
    sts = render.render_statefulset(OWNER, decl(), RenderOptions())
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations[annotation] == expected
    # the annotated port is the container's metrics port
    metrics = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}["metrics"]
    assert annotations["prometheus.io/port"] == str(metrics)


@pytest.mark.parametrize(
    ("token_secret", "volume_names"), [(None, {"tmp"}), ("tok", {"tmp", "token"})]
)
def test_writable_paths_are_volumes(token_secret, volume_names):
    sts = render.render_statefulset(OWNER, decl(), RenderOptions(token_secret=token_secret))
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert set(volumes) == volume_names
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}
    mounts = {m["mountPath"]: m for m in container(sts)["volumeMounts"]}
    assert mounts["/tmp"] == {"name": "tmp", "mountPath": "/tmp"}
    assert mounts["/data"] == {"name": "data", "mountPath": "/data"}  # the PVC template
    # with a read-only root, every mount the node writes to must be a volume
    writable = {m["name"] for m in mounts.values() if not m.get("readOnly")}
    assert writable == {"tmp", "data"}


def test_hardening_reaches_running_statefulsets_through_the_update_patch():
    desired = render.render_statefulset(OWNER, decl(), RenderOptions())
    template = render.statefulset_update(desired)["spec"]["template"]
    assert template["spec"]["securityContext"]["fsGroup"] == 10001
    assert template["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


@pytest.mark.parametrize(
    ("spread", "key"),
    [
        ("preferred", "preferredDuringSchedulingIgnoredDuringExecution"),
        ("required", "requiredDuringSchedulingIgnoredDuringExecution"),
        ("none", None),
    ],
)
def test_anti_affinity_spreads_shards(spread, key):
    pod = render.render_statefulset(OWNER, decl(placement={"spread": spread}), RenderOptions())
    affinity = pod["spec"]["template"]["spec"].get("affinity")
    if key is None:
        assert affinity is None
    else:
        assert list(affinity["podAntiAffinity"]) == [key]


def test_owner_references_and_service():
    for obj in all_children(decl()):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "recstore.io/v1alpha1", "kind": "EmbeddingTable",
                       "name": "clicks", "uid": "0b9c0d2e-uid", "controller": True,
                       "blockOwnerDeletion": True}  # fmt: skip
        assert obj["metadata"]["namespace"] == "ml"
    svc = render.render_service(OWNER)
    assert svc["spec"]["clusterIP"] == "None"
    assert {p["port"] for p in svc["spec"]["ports"]} == {50051, 9100}
    assert render.render_pdb(OWNER)["spec"]["maxUnavailable"] == 1


def test_shard_endpoint_is_the_pod_dns_name():
    options = RenderOptions(cluster_domain="corp.local")
    assert render.shard_endpoint(OWNER, 2, options) == (
        "clicks-ps-2.clicks-ps.ml.svc.corp.local:50051"
    )


def test_an_apply_after_a_grow_rolls_the_pods_the_grow_kept():
    """A grow scales up with a partition so the running pods keep their revision (and
    their --num-shards); the next apply must reset it, or those pods never get a newer
    template (an image, the new --num-shards)."""
    desired = render.render_statefulset(OWNER, decl(), RenderOptions())
    strategy = render.statefulset_update(desired)["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}


def test_update_patch_leaves_immutable_fields_alone():
    desired = render.render_statefulset(OWNER, decl(), RenderOptions())
    update = render.statefulset_update(desired)
    assert set(update["spec"]) == {"template", "updateStrategy",
                                   "persistentVolumeClaimRetentionPolicy"}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("clicks", True),
        ("a" * 49, True),
        ("a" * 50, False),
        ("1abc", False),
        ("a.b", False),
        ("clicks\n", False),
    ],
)
def test_name_problem(name, ok):
    assert (render.name_problem(name) is None) == ok


@pytest.mark.parametrize(
    ("sts_status", "generation", "rolling"),
    [
        ({}, 1, True),
        ({"observedGeneration": 1, "updatedReplicas": 2}, 1, False),
        ({"observedGeneration": 1, "updatedReplicas": 2}, 2, True),
        ({"observedGeneration": 2, "updatedReplicas": 1}, 2, True),
        ({"observedGeneration": 2, "updatedReplicas": 2, "currentRevision": "a",
          "updateRevision": "b"}, 2, True),
    ],
)  # fmt: skip
def test_rolling_detection(sts_status, generation, rolling):
    sts = {"metadata": {"name": "x", "generation": generation}, "spec": {"replicas": 2},
           "status": sts_status}  # fmt: skip
    assert statefulset_rolling(sts) == rolling


def test_observe_reads_pod_readiness():
    sts = {"metadata": {"name": "x-ps", "generation": 1}, "spec": {"replicas": 3},
           "status": {"observedGeneration": 1, "updatedReplicas": 3}}  # fmt: skip
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    pods = [
        {"metadata": {"name": "x-ps-0"}, **ready},
        {"metadata": {"name": "x-ps-1", "deletionTimestamp": "now"}, **ready},
    ]
    obs = observe(sts, pods, lambda i: f"e{i}")
    assert obs.running_shards == 3 and not obs.rolling
    assert [(s.index, s.endpoint, s.ready) for s in obs.shards] == [
        (0, "e0", True),
        (1, "e1", False),
        (2, "e2", False),
    ]
    assert observe(None, [], str).running_shards is None


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_render_valid_children(example):
    cr = yaml.safe_load(example.read_text())
    d = parse_declaration(cr["spec"], default_name=cr["metadata"]["name"])
    owner = Owner(cr["metadata"]["name"], "default", "uid")
    assert render.name_problem(owner.name) is None
    for obj in (render.render_statefulset(owner, d, RenderOptions()), render.render_service(owner),
                render.render_pdb(owner)):  # fmt: skip
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-03-04T05:06:07Z", "final-20260304T050607Z"),
        ("2026-03-04T07:06:07.123456+02:00", "final-20260304T050607Z"),
    ],
)
def test_final_checkpoint_id_is_stable_for_a_deletion(stamp, expected):
    from recstore.operator.handlers import final_checkpoint_id

    assert final_checkpoint_id(stamp) == expected


@pytest.mark.parametrize(
    ("metadata", "status", "current"),
    [
        ({"generation": 2}, {"observedGeneration": 2}, True),
        ({"generation": 2}, {"observedGeneration": 1}, False),  # an apply is under way
        ({"generation": 1}, {}, True),  # nothing published yet
        ({}, {"observedGeneration": 1}, True),
    ],
)
def test_the_refresh_waits_while_a_spec_change_is_applied(metadata, status, current):
    from recstore.operator.status import applied_generation_current

    body = {"metadata": metadata, "status": status}
    assert applied_generation_current(body) is current
