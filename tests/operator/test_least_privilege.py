"""PS pods hold no API token and mount their TLS Secret; tables run only allowed images;
a shard the scheduler cannot place fails its table with the scheduler's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from recstore.core.reconcile import parse_declaration
from recstore.operator import render
from recstore.operator.config import OperatorConfig
from recstore.operator.declared import validate
from recstore.operator.render import Owner, RenderOptions
from recstore.operator.status import observe

K8S_VERSION = kubernetes_validate.utils.latest_version()
OWNER = Owner(name="clicks", namespace="ml", uid="0b9c0d2e-uid")
DEFAULT_IMAGE = "registry.example/recstore-ps:1.0"


def _decl(**spec: Any):
    return parse_declaration({"numEmbeddings": 100, "embeddingDim": 8, **spec}, default_name="t")


def _pod(options: RenderOptions) -> dict[str, Any]:
    sts = render.render_statefulset(OWNER, _decl(), options)
    assert kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
    pod: dict[str, Any] = sts["spec"]["template"]["spec"]
    return pod


def test_ps_pods_mount_no_service_account_token() -> None:
    assert _pod(RenderOptions())["automountServiceAccountToken"] is False


@pytest.mark.parametrize("mutual", [False, True])
def test_ps_pods_serve_tls_from_the_mounted_secret(mutual: bool) -> None:
    pod = _pod(RenderOptions(tls_secret="recstore-tls", tls_mutual=mutual))
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "recstore-tls"
    keys = [item["key"] for item in volumes["tls"]["secret"]["items"]]
    assert keys == ["tls.crt", "tls.key", "ca.crt"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    assert mount["readOnly"] is True
    args = container["args"]
    directory = mount["mountPath"]
    assert args[args.index("--tls-cert") + 1] == f"{directory}/tls.crt"
    assert args[args.index("--tls-key") + 1] == f"{directory}/tls.key"
    assert ("--tls-client-ca" in args) is mutual
    if mutual:
        assert args[args.index("--tls-client-ca") + 1] == f"{directory}/ca.crt"


def test_without_a_tls_secret_pods_serve_plaintext() -> None:
    pod = _pod(RenderOptions())
    assert "tls" not in {v["name"] for v in pod["volumes"]}
    assert not any(a.startswith("--tls") for a in pod["containers"][0]["args"])


ALLOWED = OperatorConfig(ps_image=DEFAULT_IMAGE, allowed_images=("registry.example/team-*/ps:*",))


@pytest.mark.parametrize(
    ("config", "image", "allowed"),
    [
        (ALLOWED, None, True),  # the operator's own image
        (ALLOWED, DEFAULT_IMAGE, True),
        (ALLOWED, "registry.example/team-a/ps:2", True),
        (ALLOWED, "evil.example/miner:latest", False),
        (ALLOWED, "registry.example/team-a/other:2", False),
        (OperatorConfig(ps_image=DEFAULT_IMAGE, allowed_images=()), "my/ps:9", False),
        (OperatorConfig(ps_image=DEFAULT_IMAGE), "my/ps:9", True),  # no list: development
    ],
)
def test_only_allowed_images_pass_validation(
    config: OperatorConfig, image: str | None, allowed: bool
) -> None:
    spec: dict[str, Any] = {"numEmbeddings": 10, "embeddingDim": 4}
    if image is not None:
        spec["placement"] = {"image": image}
    checked = validate(OWNER, spec, config)
    assert (checked.declaration is not None) is allowed
    if not allowed:
        assert checked.problem is not None
        assert f"spec.placement.image {image!r} is not allowed" in checked.problem


def test_allow_list_and_tls_come_from_the_environment(tls_files) -> None:
    config = OperatorConfig.from_env(
        {
            "RECSTORE_ALLOWED_IMAGES": "a/ps:*, b/ps:1",
            "RECSTORE_PS_TLS_SECRET": "recstore-tls",
            "RECSTORE_PS_TLS_MUTUAL": "true",
            "RECSTORE_TLS_CA": str(tls_files.ca),
            "RECSTORE_TLS_CERT": str(tls_files.client_cert),
            "RECSTORE_TLS_KEY": str(tls_files.client_key),
            "RECSTORE_TLS_SERVER_NAME": "recstore-ps",
            "RECSTORE_PROVISIONER_TOKEN_FILE": "/var/run/secrets/recstore/operator-token/token",
        }
    )
    assert config.allowed_images == ("a/ps:*", "b/ps:1")
    assert (config.ps_tls_secret, config.ps_tls_mutual) == ("recstore-tls", True)
    assert config.tls is not None and config.tls.server_name == "recstore-ps"
    assert config.provisioner_token_file == Path("/var/run/secrets/recstore/operator-token/token")
    assert OperatorConfig.from_env({}).allowed_images is None


def test_tls_pods_need_an_operator_that_can_verify_them(tls_files) -> None:
    with pytest.raises(ValueError, match="RECSTORE_TLS_CA"):
        OperatorConfig.from_env({"RECSTORE_PS_TLS_SECRET": "recstore-tls"})
    server_only = {"RECSTORE_PS_TLS_SECRET": "recstore-tls", "RECSTORE_TLS_CA": str(tls_files.ca)}
    with pytest.raises(ValueError, match="RECSTORE_TLS_CERT"):
        OperatorConfig.from_env({**server_only, "RECSTORE_PS_TLS_MUTUAL": "true"})
    assert OperatorConfig.from_env(server_only).ps_tls_secret == "recstore-tls"


def test_the_provisioner_token_file_is_read_at_every_call(tmp_path: Path) -> None:
    path = tmp_path / "token"
    config = OperatorConfig(provisioner_token_file=path)
    assert config.read_provisioner_token() is None  # not created yet
    path.write_text("first\n")
    assert config.read_provisioner_token() == "first"
    path.write_text("rotated")
    assert config.read_provisioner_token() == "rotated"


def _sts(replicas: int) -> dict[str, Any]:
    return {"metadata": {"name": "clicks-ps", "generation": 1}, "spec": {"replicas": replicas}}


def test_an_unschedulable_shard_is_reported_with_the_schedulers_message() -> None:
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    pending = {
        "metadata": {"name": "clicks-ps-1"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": message},
            ],
        },
    }  # fmt: skip
    ready = {
        "metadata": {"name": "clicks-ps-0"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    seen = observe(_sts(2), [ready, pending], lambda i: f"shard-{i}")
    assert seen.refused == f"shard 1 cannot be scheduled: {message}"
    assert observe(_sts(2), [ready], lambda i: f"shard-{i}").refused is None
