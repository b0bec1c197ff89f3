"""Which credential goes where: the admin token to the admin API only, the PS token to PS nodes.

A fake PS node on loopback records the metadata of every call it gets (and
answers UNIMPLEMENTED); a fake admin API answers discovery with that node.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import grpc
import pytest
import torch

from recstore.client import RecStoreClient
from recstore.core import SlotMap, TableSpec

ADMIN_TOKEN = "admin-secret"
PS_TOKEN = "ps-secret"


class _RecordingNode(grpc.GenericRpcHandler):
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    def service(self, details: grpc.HandlerCallDetails) -> None:
        self.calls.append((details.method, dict(details.invocation_metadata)))
        return None  # every method is UNIMPLEMENTED


@pytest.fixture
def fake_node() -> Iterator[tuple[str, _RecordingNode]]:
    handler = _RecordingNode()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", handler
    server.stop(None)


class _Admin(BaseHTTPRequestHandler):
    """Discovery for any table: one shard, at ``endpoint``; or a redirect to ``redirect_to``."""

    endpoint: ClassVar[str] = ""
    redirect_to: ClassVar[str | None] = None
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.redirect_to is not None and self.path.startswith("/api/"):
            self.send_response(307)
            self.send_header("Location", f"{self.redirect_to}/elsewhere{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        name = self.path.rsplit("/", 2)[-2]
        spec = TableSpec(name=name, num_embeddings=10, embedding_dim=4, shards=1)
        document: dict[str, Any] = {
            "name": name, "spec": spec.to_wire(), "dtype": "float32", "embedding_dim": 4,
            "num_embeddings": 10, "shards": 1, "slot_map": SlotMap.initial(1).to_dict(),
            "endpoints": [self.endpoint],
        }  # fmt: skip
        data = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def admin_url(fake_node: tuple[str, _RecordingNode]) -> Iterator[str]:
    _Admin.endpoint, _Admin.redirect_to, _Admin.seen = fake_node[0], None, []
    with _serve(_Admin) as url:
        yield url


def _init_through_discovery(admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECSTORE_ADMIN_URL", admin_url)
    monkeypatch.setenv("RECSTORE_TOKEN", ADMIN_TOKEN)
    monkeypatch.delenv("RECSTORE_PS_ENDPOINTS", raising=False)
    client = RecStoreClient(role="credentials-test")
    try:
        with pytest.raises(RuntimeError):  # the fake node implements nothing
            client.init_data("creds", (10, 4), torch.float32)
    finally:
        client.close()


def test_no_ps_token_means_no_credential_to_ps_nodes(
    admin_url: str, fake_node: tuple[str, _RecordingNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECSTORE_PS_TOKEN", raising=False)
    _init_through_discovery(admin_url, monkeypatch)
    assert _Admin.seen and all(auth == f"Bearer {ADMIN_TOKEN}" for _, auth in _Admin.seen)
    calls = fake_node[1].calls
    assert calls, "the SDK never called the node"
    for method, metadata in calls:
        assert "authorization" not in metadata, method
        assert ADMIN_TOKEN not in json.dumps(metadata), method


def test_ps_token_goes_to_ps_nodes_only(
    admin_url: str, fake_node: tuple[str, _RecordingNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECSTORE_PS_TOKEN", PS_TOKEN)
    _init_through_discovery(admin_url, monkeypatch)
    assert all(auth == f"Bearer {ADMIN_TOKEN}" for _, auth in _Admin.seen)
    calls = fake_node[1].calls
    assert calls and all(m.get("authorization") == f"Bearer {PS_TOKEN}" for _, m in calls)


def test_a_ps_token_given_to_set_admin_url_goes_to_ps_nodes_only(
    admin_url: str, fake_node: tuple[str, _RecordingNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECSTORE_PS_TOKEN", "the-environment-s")  # the argument wins
    client = RecStoreClient(role="credentials-argument")
    try:
        client.set_admin_url(admin_url, ADMIN_TOKEN, ps_token=PS_TOKEN)
        with pytest.raises(RuntimeError):  # the fake node implements nothing
            client.init_data("creds", (10, 4), torch.float32)
        client.set_ps_config("127.0.0.1", int(fake_node[0].rsplit(":", 1)[1]))  # kept
        with pytest.raises(RuntimeError):
            client.init_data("creds2", (10, 4), torch.float32)
    finally:
        client.close()
    assert _Admin.seen and all(auth == f"Bearer {ADMIN_TOKEN}" for _, auth in _Admin.seen)
    calls = fake_node[1].calls
    assert len(calls) >= 2 and all(m.get("authorization") == f"Bearer {PS_TOKEN}" for _, m in calls)


class _Elsewhere(BaseHTTPRequestHandler):
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_admin_token_is_not_sent_along_a_redirect(
    admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _Elsewhere.seen = []
    with _serve(_Elsewhere) as elsewhere:
        _Admin.redirect_to = elsewhere
        _init_through_discovery(admin_url, monkeypatch)
    assert _Admin.seen[0][1] == f"Bearer {ADMIN_TOKEN}"
    assert _Elsewhere.seen == [None]  # followed, but without the admin API's token
