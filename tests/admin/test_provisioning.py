"""Provisioners: the Kubernetes one's requests, failure handling, and the local hook."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from recstore.admin import Settings, create_app
from recstore.admin.errors import ProvisioningError
from recstore.admin.provisioning import (
    KubernetesProvisioner,
    LocalProvisionerHook,
    Provisioner,
)
from recstore.core import TableSpec
from recstore.core.pool import PoolSpec
from recstore.core.resource import CHECKPOINT_REQUEST_ANNOTATION

BASE = "/apis/recstore.io/v1alpha1/namespaces/ml/embeddingtables"


class FakeApiServer:
    """An HTTP-level stand-in for the Kubernetes API: records requests, answers as told."""

    def __init__(self, resource: dict[str, Any] | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.status = 201
        #: what a GET answers: the EmbeddingTable as stored
        self.resource = resource or {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status >= 400:
            return httpx.Response(self.status, json={"kind": "Status", "message": "denied by test"})
        return httpx.Response(self.status, json=self.resource if request.method == "GET" else {})

    def provisioner(self) -> KubernetesProvisioner:
        client = httpx.Client(base_url="https://k8s.test", transport=httpx.MockTransport(self))
        return KubernetesProvisioner(client, namespace="ml")


def test_kubernetes_provisioner_requests() -> None:
    api = FakeApiServer()
    k8s = api.provisioner()
    spec = TableSpec(name="user_emb", num_embeddings=10, embedding_dim=4, shards=2)
    k8s.create_table(spec)
    k8s.update_table(spec.model_copy(update={"shards": 3}), previous=spec)
    k8s.request_checkpoint("user_emb", 7)
    k8s.delete_table("user_emb")

    create, update, read, checkpoint, delete = api.requests
    assert (create.method, create.url.path) == ("POST", BASE)
    manifest = json.loads(create.content)
    assert manifest["apiVersion"] == "recstore.io/v1alpha1" and manifest["kind"] == "EmbeddingTable"
    assert manifest["metadata"]["name"] == "user-emb"  # Kubernetes names have no '_'
    assert manifest["spec"] == spec.to_wire()
    assert (update.method, update.url.path) == ("PATCH", f"{BASE}/user-emb")
    assert update.headers["content-type"] == "application/merge-patch+json"
    assert json.loads(update.content)["spec"]["shards"] == 3
    assert (read.method, read.url.path) == ("GET", f"{BASE}/user-emb")
    assert (checkpoint.method, checkpoint.url.path) == ("PATCH", f"{BASE}/user-emb")
    annotations = json.loads(checkpoint.content)["metadata"]["annotations"]
    assert annotations == {CHECKPOINT_REQUEST_ANNOTATION: "7"}
    assert (delete.method, delete.url.path) == ("DELETE", f"{BASE}/user-emb")


def test_a_table_on_a_pool_is_patched_without_shards_of_its_own() -> None:
    """The operator refuses a table on a pool that declares shards: a patch names the pool."""
    api = FakeApiServer()
    spec = TableSpec(name="clicks", num_embeddings=10, embedding_dim=4, shards=2)
    changed = spec.model_copy(update={"optimizer": {"kind": "sgd", "lr": 0.5}})
    api.provisioner().update_table(changed, previous=spec, pool="criteo")
    (update,) = api.requests
    sent = json.loads(update.content)["spec"]
    assert sent["pool"] == "criteo" and "shards" not in sent
    assert sent["optimizer"]["lr"] == 0.5


def _checkpoint(request_id: int, state: str) -> dict[str, Any]:
    return {"id": f"request-{request_id}", "requestId": request_id, "state": state}


@pytest.mark.parametrize(
    ("annotated", "reported", "refused"),
    [
        (None, None, False),  # none asked yet
        ("6", _checkpoint(6, "Completed"), False),
        ("6", _checkpoint(6, "Failed"), False),
        ("6", None, True),  # not taken yet
        ("6", _checkpoint(6, "Running"), True),
        ("6", _checkpoint(5, "Completed"), True),  # the status still says the one before
        ("not-an-id", None, False),  # no request of the admin API's: replaced
    ],
)  # fmt: skip
def test_kubernetes_checkpoint_requests_one_at_a_time(
    annotated: str | None, reported: dict[str, Any] | None, refused: bool
) -> None:
    metadata: dict[str, Any] = {"name": "user-emb", "resourceVersion": "41"}
    if annotated is not None:
        metadata["annotations"] = {CHECKPOINT_REQUEST_ANNOTATION: annotated}
    status = {"phase": "Ready", "checkpointRequest": reported} if reported else None
    api = FakeApiServer({"metadata": metadata, "status": status})
    if refused:
        with pytest.raises(ProvisioningError, match=r"checkpoint 6 of table 'user_emb' is still "
                           r"running \(the operator has not reported it") as error:  # fmt: skip
            api.provisioner().request_checkpoint("user_emb", 7)
        assert error.value.status_code == 409
        assert [r.method for r in api.requests] == ["GET"]  # nothing written
        return
    api.provisioner().request_checkpoint("user_emb", 7)
    _read, patch = api.requests
    # the version read: a request annotated meanwhile makes this one fail, not replace it
    assert json.loads(patch.content)["metadata"] == {
        "resourceVersion": "41", "annotations": {CHECKPOINT_REQUEST_ANNOTATION: "7"}
    }  # fmt: skip


def test_a_checkpoint_request_that_loses_a_race_is_decided_again() -> None:
    """The annotation is written at the resourceVersion read: when the resource changed
    meanwhile (409), it is read again; a request annotated by someone else in between is
    then refused, never replaced."""
    free: dict[str, Any] = {"metadata": {"resourceVersion": "1"}}
    taken = {"metadata": {"resourceVersion": "2",
                          "annotations": {CHECKPOINT_REQUEST_ANNOTATION: "6"}}}  # fmt: skip
    reads = iter([free, free])
    seen: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        if request.method == "GET":
            return httpx.Response(200, json=next(reads))
        if seen.count("PATCH") == 1:
            return httpx.Response(409, json={"message": "the object has been modified"})
        return httpx.Response(200, json={})

    client = httpx.Client(base_url="https://k8s.test", transport=httpx.MockTransport(api))
    KubernetesProvisioner(client, namespace="ml").request_checkpoint("user_emb", 7)
    assert seen == ["GET", "PATCH", "GET", "PATCH"]

    reads, seen[:] = iter([free, taken]), []
    with pytest.raises(ProvisioningError, match="checkpoint 6 of table 'user_emb' is still"):
        KubernetesProvisioner(client, namespace="ml").request_checkpoint("user_emb", 7)
    assert seen == ["GET", "PATCH", "GET"]


def test_kubernetes_errors_become_provisioning_errors() -> None:
    api = FakeApiServer()
    api.status = 403
    with pytest.raises(ProvisioningError, match=r"403.*denied by test"):
        api.provisioner().create_table(TableSpec(name="t", num_embeddings=1, embedding_dim=1))
    api.status = 404
    api.provisioner().delete_table("t")  # already gone: fine


def test_refused_create_writes_nothing(tmp_path: Path) -> None:
    api = FakeApiServer()
    api.status = 409
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'a.db'}", bootstrap_token=SecretStr("s")
    )
    headers = {"Authorization": "Bearer s"}
    with TestClient(create_app(settings, provisioner=api.provisioner())) as client:
        spec = {"name": "t", "numEmbeddings": 5, "embeddingDim": 2}
        r = client.post("/api/v1/tables", json=spec, headers=headers)
        assert r.status_code == 409 and "denied by test" in r.json()["detail"]
        assert client.get("/api/v1/tables", headers=headers).json()["total"] == 0
        assert client.get("/api/v1/events", headers=headers).json()["total"] == 0
        api.status = 201
        assert client.post("/api/v1/tables", json=spec, headers=headers).status_code == 201
        api.status = 500
        r = client.patch("/api/v1/tables/t", json={"shards": 4}, headers=headers)
        assert r.status_code == 502
        assert client.get("/api/v1/tables/t", headers=headers).json()["spec"]["shards"] == 1


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def create_table(self, spec: TableSpec, *, pool: str | None = None) -> None:
        self.calls.append(("create", spec.name))

    def update_table(
        self, spec: TableSpec, *, previous: TableSpec, pool: str | None = None
    ) -> None:
        self.calls.append(("update", (previous.shards, spec.shards)))

    def delete_table(self, name: str) -> None:
        self.calls.append(("delete", name))

    def request_checkpoint(self, name: str, checkpoint_id: int) -> None:
        self.calls.append(("checkpoint", (name, checkpoint_id)))

    def create_pool(self, name: str, spec: PoolSpec) -> None:
        self.calls.append(("create pool", name))

    def update_pool(self, name: str, spec: PoolSpec, *, previous: PoolSpec) -> None:
        self.calls.append(("update pool", (previous.shards, spec.shards)))

    def delete_pool(self, name: str) -> None:
        self.calls.append(("delete pool", name))


def test_local_hook_forwards_once_attached(tmp_path: Path) -> None:
    hook = LocalProvisionerHook()
    assert isinstance(hook, Provisioner) and isinstance(Recorder(), Provisioner)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'a.db'}", bootstrap_token=SecretStr("s")
    )
    headers = {"Authorization": "Bearer s"}
    recorder = Recorder()
    with TestClient(create_app(settings, provisioner=hook)) as client:
        spec = {"name": "early", "numEmbeddings": 5, "embeddingDim": 2}
        assert client.post("/api/v1/tables", json=spec, headers=headers).status_code == 201
        assert recorder.calls == []  # nothing attached yet: the table just stays Pending
        hook.attach(recorder)
        spec = {"name": "late", "numEmbeddings": 5, "embeddingDim": 2}
        client.post("/api/v1/tables", json=spec, headers=headers)
        client.patch("/api/v1/tables/late", json={"shards": 2}, headers=headers)
        checkpoint = client.post("/api/v1/tables/late/checkpoints", headers=headers).json()
        client.delete("/api/v1/tables/late", headers=headers)
        hook.detach()
        client.delete("/api/v1/tables/early", headers=headers)
    assert recorder.calls == [
        ("create", "late"),
        ("update", (1, 2)),
        ("checkpoint", ("late", checkpoint["id"])),
        ("delete", "late"),
    ]


def test_in_cluster_needs_a_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="service account"):
        KubernetesProvisioner.in_cluster()
