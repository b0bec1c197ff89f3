"""Fixtures for the operator tests: a Kubernetes API double, a PS double, a running operator.

kmock's KubernetesEmulator stores objects and serves watches but runs no
controllers and assigns no server-side fields, so ``ApiServer`` adds uid,
resourceVersion, generation and a name from ``generateName`` the way the real
API server does (and refuses a PUT carrying a stale resourceVersion with 409, a JSON patch
whose test fails with 422),
and tests write StatefulSet and pod status themselves. The PS double is a real gRPC
server on loopback that records CreateTable and Save calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import grpc
import httpx
import jsonpatch
import kmock
import kopf
import pytest
from kopf.testing import KopfRunner

from recstore.core.resource import API_VERSION, PLURAL, POOL_PLURAL, collection_path
from recstore.operator.config import OperatorConfig
from recstore.operator.handlers import register
from recstore.v1 import ps_pb2, ps_pb2_grpc

NS = "default"
ET = collection_path(NS)
PS_TOKEN = "ps-secret-token"


class ApiServer(kmock.KubernetesEmulator):
    """The emulator plus the fields the API server assigns: uid, resourceVersion, generation."""

    _versions = itertools.count(1)

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and request.method == kmock.method.PUT:
            return await self._replace(request)
        data = request.data
        if request.resource is not None and isinstance(data, dict):
            meta = (
                data.setdefault("metadata", {})
                if request.action in (kmock.action.CREATE, kmock.action.UPDATE)
                else None
            )
            if request.action == kmock.action.CREATE and meta is not None:
                if not meta.get("name") and meta.get("generateName"):  # e.g. kopf's Events
                    meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:10]}"
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
                meta["generation"] = 1
            if request.action == kmock.action.UPDATE and meta is not None:
                key = (request.resource, request.namespace, request.name)
                current = self.objects[key] if key in self.objects else None  # noqa: SIM401 (no .get)
                if current is not None and not current.deleted:
                    old = current.get("metadata", {})
                    meta.setdefault("uid", old.get("uid"))
                    spec_changed = "spec" in data and request.subresource is None
                    generation = int(old.get("generation", 1))
                    meta["generation"] = generation + 1 if spec_changed else generation
            if meta is not None:
                meta["resourceVersion"] = str(next(self._versions))
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as error:
            # a JSON patch whose "test" op fails (kopf tests the resourceVersion it read
            # before removing its finalizer): the API server answers 422, and kopf tries
            # again at its next cycle
            return aiohttp.web.json_response({"message": str(error)}, status=422)

    async def _replace(self, request: kmock.Request) -> Any:
        """PUT (kmock serves none): a compare-and-swap on resourceVersion, then the update.

        The bodies the operator replaces carry every field, so applying one as an update
        stores the same object a real replace does.
        """
        key = (request.resource, request.namespace, request.name)
        current = self.objects[key] if key in self.objects else None  # noqa: SIM401 (no .get)
        if current is None or current.deleted:
            return aiohttp.web.json_response({"message": "not found"}, status=404)
        expected = (request.data or {}).get("metadata", {}).get("resourceVersion")
        if expected != current.get("metadata", {}).get("resourceVersion"):
            message = "the object has been modified; apply your changes to the latest version"
            return aiohttp.web.json_response({"message": message}, status=409)
        data = dict(request.data)
        data["metadata"] = {**data["metadata"], "resourceVersion": str(next(self._versions))}
        async with self._lock:
            current.patch(data)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": current.raw})
        return aiohttp.web.json_response(current.raw)


@pytest.fixture
async def api_server(tmp_path, monkeypatch) -> AsyncIterator[ApiServer]:
    async with ApiServer() as server, kmock.Server(server):
        server.resources["v1/namespaces"] = {"namespaced": False, "kind": "Namespace"}
        server.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = {
            "namespaced": False,
            "kind": "CustomResourceDefinition",
        }
        server.resources[f"{API_VERSION}/{PLURAL}"] = {
            "namespaced": True,
            "kind": "EmbeddingTable",
            "singular": "embeddingtable",
            "shortnames": ["et"],
            "subresources": ["status"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }
        server.resources[f"{API_VERSION}/{POOL_PLURAL}"] = {
            "namespaced": True,
            "kind": "EmbeddingPool",
            "singular": "embeddingpool",
            "shortnames": ["ep"],
            "subresources": ["status"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }
        for res, kind in [
            ("v1/events", "Event"),
            ("v1/pods", "Pod"),
            ("v1/services", "Service"),
            ("v1/secrets", "Secret"),
            ("apps/v1/statefulsets", "StatefulSet"),
            ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget"),
        ]:
            server.resources[res] = {"namespaced": True, "kind": kind}
        kubeconfig = {
            "current-context": "test",
            "contexts": [{"name": "test", "context": {"cluster": "kmock", "user": "op"}}],
            "clusters": [{"name": "kmock", "cluster": {"server": str(server.url)}}],
            "users": [{"name": "op", "user": {"token": "operator-token"}}],
        }
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(path))
        yield server


@pytest.fixture
async def api(api_server: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=str(api_server.url), timeout=10) as client:
        yield client


@dataclass
class FakePS(ps_pb2_grpc.ParameterServerServicer):
    """Records what the operator asks of the shards; fails Save while ``fail_saves`` > 0;
    holds each Save until ``hold_saves`` is set, when it is an Event (a checkpoint that
    takes its time)."""

    created: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    saves: list[str] = field(default_factory=list)
    #: the tables each Save named (empty: every table of the node)
    saved_tables: list[tuple[str, ...]] = field(default_factory=list)
    fail_saves: int = 0
    hold_saves: asyncio.Event | None = None
    port: int = 0

    async def CreateTable(self, request, context):
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {PS_TOKEN}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
        self.created.append(json.loads(request.spec_json))
        return ps_pb2.CreateTableResponse(created=True)

    async def DropTable(self, request, context):
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {PS_TOKEN}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
        self.dropped.append(request.table)
        return ps_pb2.DropTableResponse()

    async def Save(self, request, context):
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {PS_TOKEN}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
        if self.hold_saves is not None:
            await self.hold_saves.wait()
        if self.fail_saves > 0:
            self.fail_saves -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "disk busy")
        self.saves.append(request.checkpoint_id)
        self.saved_tables.append(tuple(request.tables))
        info = ps_pb2.CheckpointInfo(checkpoint_id=request.checkpoint_id)
        return ps_pb2.SaveResponse(checkpoint=info)


@pytest.fixture
async def fake_ps() -> AsyncIterator[FakePS]:
    ps = FakePS()
    server = grpc.aio.server()
    ps_pb2_grpc.add_ParameterServerServicer_to_server(ps, server)
    ps.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield ps
    await server.stop(None)


@pytest.fixture
def admin_api() -> Any:
    """Stands in for the admin API (plain HTTP): records node registrations and status PUTs."""
    return kmock.RawHandler()


@pytest.fixture
async def admin_server(admin_api: kmock.RawHandler) -> AsyncIterator[kmock.RawHandler]:
    async with admin_api, kmock.Server(admin_api):
        admin_api["put"] << {"ok": True}
        admin_api["post"] << {"id": 1}
        yield admin_api


async def wait_for(
    check: Callable[[], Any | Awaitable[Any]], *, timeout: float = 20.0, what: str = ""
) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(0.05)


@pytest.fixture
def operator_config(fake_ps: FakePS, admin_server: kmock.RawHandler) -> OperatorConfig:
    return OperatorConfig(
        ps_image="registry.example/recstore-ps:1.0",
        ps_token_secret="ps-token",
        ps_read_only_token_secret="ps-read-only-token",
        admin_url=str(admin_server.url),
        provisioner_token="provisioner-token",
        status_interval=0.2,
        ps_port=fake_ps.port,
        rpc_timeout=5,
        save_timeout=5,
        checkpoint_retries=2,
        retry_delay=0.2,
    )


@contextlib.asynccontextmanager
async def running_operator(
    api: httpx.AsyncClient, config: OperatorConfig
) -> AsyncIterator[KopfRunner]:
    """The real operator (kopf in a thread, a fresh registry) with ``config``, the PS token
    Secret in place."""
    import base64

    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "ps-token", "namespace": NS},
        "data": {"token": base64.b64encode(PS_TOKEN.encode()).decode()},
    }
    (await api.post(f"/api/v1/namespaces/{NS}/secrets", json=secret)).raise_for_status()
    registry = kopf.OperatorRegistry()
    register(registry, config)
    runner = KopfRunner(["run", "--standalone", "-A"], registry=registry, timeout=30)
    runner.__enter__()
    try:
        yield runner
    finally:
        # The thread's exit waits for kopf to stop; our loop must keep serving kmock meanwhile.
        await asyncio.to_thread(runner.__exit__, None, None, None)


@pytest.fixture
async def operator(
    api_server: ApiServer, api: httpx.AsyncClient, operator_config: OperatorConfig
) -> AsyncIterator[KopfRunner]:
    async with running_operator(api, operator_config) as runner:
        yield runner
