"""Which credential goes where: the admin token to the admin API only, the PS token to PS nodes.

A fake PS node on loopback records the metadata of every call it gets (and
answers UNIMPLEMENTED); a fake admin API answers discovery with that node.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from typing import Any

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


def _discovery(endpoint: str, fake_http: Any) -> Any:
    """A fake admin API's answer: discovery for any table, one shard at ``endpoint``."""

    def answer(request: Any) -> Any:
        name = request.path.rsplit("/", 2)[-2]
        spec = TableSpec(name=name, num_embeddings=10, embedding_dim=4, shards=1)
        return fake_http.json(200, {
            "name": name, "spec": spec.to_wire(), "dtype": "float32", "embedding_dim": 4,
            "num_embeddings": 10, "shards": 1, "slot_map": SlotMap.initial(1).to_dict(),
            "endpoints": [endpoint],
        })  # fmt: skip

    return answer


@pytest.fixture
def admin(fake_node: tuple[str, _RecordingNode], fake_http: Any) -> Any:
    """The fake admin API (its ``requests`` are what the SDK sent it)."""
    return fake_http(_discovery(fake_node[0], fake_http))


def _authorizations(server: Any) -> list[str | None]:
    return [request.headers.get("Authorization") for request in server.requests]


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
    admin: Any, fake_node: tuple[str, _RecordingNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECSTORE_PS_TOKEN", raising=False)
    _init_through_discovery(admin.url, monkeypatch)
    seen = _authorizations(admin)
    assert seen and all(auth == f"Bearer {ADMIN_TOKEN}" for auth in seen)
    calls = fake_node[1].calls
    assert calls, "the SDK never called the node"
    for method, metadata in calls:
        assert "authorization" not in metadata, method
        assert ADMIN_TOKEN not in json.dumps(metadata), method


def test_ps_token_goes_to_ps_nodes_only(
    admin: Any, fake_node: tuple[str, _RecordingNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECSTORE_PS_TOKEN", PS_TOKEN)
    _init_through_discovery(admin.url, monkeypatch)
    assert all(auth == f"Bearer {ADMIN_TOKEN}" for auth in _authorizations(admin))
    calls = fake_node[1].calls
    assert calls and all(m.get("authorization") == f"Bearer {PS_TOKEN}" for _, m in calls)


def test_a_ps_token_given_to_set_admin_url_goes_to_ps_nodes_only(
    admin: Any, fake_node: tuple[str, _RecordingNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECSTORE_PS_TOKEN", "the-environment-s")  # the argument wins
    client = RecStoreClient(role="credentials-argument")
    try:
        client.set_admin_url(admin.url, ADMIN_TOKEN, ps_token=PS_TOKEN)
        with pytest.raises(RuntimeError):  # the fake node implements nothing
            client.init_data("creds", (10, 4), torch.float32)
        client.set_ps_config("127.0.0.1", int(fake_node[0].rsplit(":", 1)[1]))  # kept
        with pytest.raises(RuntimeError):
            client.init_data("creds2", (10, 4), torch.float32)
    finally:
        client.close()
    seen = _authorizations(admin)
    assert seen and all(auth == f"Bearer {ADMIN_TOKEN}" for auth in seen)
    calls = fake_node[1].calls
    assert len(calls) >= 2 and all(m.get("authorization") == f"Bearer {PS_TOKEN}" for _, m in calls)


def test_admin_token_is_not_sent_along_a_redirect(
    admin: Any, fake_http: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = fake_http(lambda request: (404, {}, b""))
    admin.answer = lambda request: (
        307,
        {"Location": f"{elsewhere.url}/elsewhere{request.path}"},
        b"",
    )
    _init_through_discovery(admin.url, monkeypatch)
    assert _authorizations(admin)[0] == f"Bearer {ADMIN_TOKEN}"
    assert _authorizations(elsewhere) == [None]  # followed, but without the admin API's token
