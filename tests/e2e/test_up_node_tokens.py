"""`recstore up` nodes require the PS token: what discovery tells a viewer lets it write nothing.

A viewer reads a table's endpoints from discovery; with no token, its own
admin API token, the admin token or the read-only token, a plain gRPC Push,
Save or DropTable on the node is refused and the table keeps its rows and
checkpoints. The SDK still trains through the admin URL with the PS token.
Over ``--tls`` as over plaintext.
"""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from recstore import RecStoreClient
from recstore.core.proto_convert import bearer_metadata
from recstore.core.tls import channel
from recstore.local.platform import LocalPlatform
from recstore.v1 import ps_pb2, ps_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROWS, DIM = 50, 4
KEYS = np.arange(ROWS, dtype="<i8").tobytes()
WRITES: dict[str, Any] = {
    "Push": lambda name: ps_pb2.PushRequest(
        table=name, keys=KEYS, values=np.full((ROWS, DIM), 9.0, "<f4").tobytes()
    ),
    "Save": lambda name: ps_pb2.SaveRequest(checkpoint_id="stolen"),
    "DropTable": lambda name: ps_pb2.DropTableRequest(table=name),
}
UNAUTHENTICATED, DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED


def _call(platform: LocalPlatform, endpoint: str, token: str | None, method: str, request: Any):
    """``method`` on the node as a raw gRPC client: (status code, reply or None)."""
    tls = platform.tls.client if platform.tls else None
    with channel(endpoint, tls) as raw:
        stub = ps_pb2_grpc.ParameterServerStub(raw)
        try:
            return grpc.StatusCode.OK, getattr(stub, method)(
                request, metadata=bearer_metadata(token), timeout=30
            )
        except grpc.RpcError as error:
            return error.code(), None


def _state_of(platform: LocalPlatform, endpoint: str, name: str) -> tuple[Any, ...]:
    """The table's rows, size and checkpoints as the node holds them (read with the PS token)."""
    token = platform.ps_token
    code, pulled = _call(
        platform, endpoint, token, "Pull", ps_pb2.PullRequest(table=name, keys=KEYS)
    )
    assert code == grpc.StatusCode.OK
    _, stats = _call(
        platform, endpoint, token, "GetTableStats", ps_pb2.GetTableStatsRequest(table=name)
    )
    _, saved = _call(platform, endpoint, token, "ListCheckpoints", ps_pb2.ListCheckpointsRequest())
    return pulled.values, stats.size, tuple(c.checkpoint_id for c in saved.checkpoints)


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_a_viewer_who_knows_the_endpoints_writes_nothing(
    tmp_path: Path, helpers: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, tls: bool
) -> None:
    platform = helpers.start_platform(tmp_path / "state", tls=tls)
    if platform.tls is not None:
        monkeypatch.setenv("RECSTORE_TLS_CA", str(platform.tls.client.ca))
    try:
        api = helpers.Api(platform)
        for name, mode in (("trained", "training"), ("served", "inference")):
            api.create_table({"name": name, "numEmbeddings": ROWS, "embeddingDim": DIM,
                              "mode": mode, "optimizer": {"kind": "sgd", "lr": 1.0}})  # fmt: skip
        for name in ("trained", "served"):
            api.wait_ready(name)
        viewer = api.http.post("/tokens", json={"name": "viewer", "role": "viewer"}).json()["token"]

        client = RecStoreClient(role=f"node-tokens-{tls}")
        try:  # the SDK trains through the admin URL with the PS token
            client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
            client.init_data("trained", (ROWS, DIM), torch.float32)
            ids = torch.arange(ROWS)
            before = client.pull("trained", ids)
            client.update("trained", ids, torch.ones(ROWS, DIM))
            torch.testing.assert_close(client.pull("trained", ids), before - 1.0)
        finally:
            client.close()

        discovered: dict[str, str] = {}
        for name in ("trained", "served"):
            reply = api.http.get(
                f"/tables/{name}/discovery", headers={"Authorization": f"Bearer {viewer}"}
            )
            assert reply.status_code == 200
            for secret in (platform.ps_token, platform.ps_read_only_token, platform.token):
                assert secret not in reply.text  # discovery hands out where, never a credential
            (discovered[name],) = reply.json()["endpoints"]
        for path in ("/nodes", "/tables/trained", "/tables"):
            text = api.http.get(path, headers={"Authorization": f"Bearer {viewer}"}).text
            assert platform.ps_token not in text and platform.ps_read_only_token not in text

        reader = platform.ps_read_only_token
        expected = {  # (table, credential) -> what every write answers
            ("trained", None): UNAUTHENTICATED,
            ("trained", viewer): UNAUTHENTICATED,
            ("trained", platform.token): UNAUTHENTICATED,
            ("trained", reader): UNAUTHENTICATED,  # a training table's nodes take no reader
            ("served", None): UNAUTHENTICATED,
            ("served", viewer): UNAUTHENTICATED,
            ("served", reader): DENIED,
        }
        states = {name: _state_of(platform, e, name) for name, e in discovered.items()}
        for (name, credential), refused in expected.items():
            for method, request in WRITES.items():
                code, _ = _call(platform, discovered[name], credential, method, request(name))
                assert code == refused, (name, method, code)
        for name, endpoint in discovered.items():
            assert _state_of(platform, endpoint, name) == states[name]
        # the reader still reads the inference table
        pull = ps_pb2.PullRequest(table="served", keys=KEYS)
        assert _call(platform, discovered["served"], reader, "Pull", pull)[0] == grpc.StatusCode.OK
        api.http.close()
    finally:
        platform.stop()
    state = tmp_path / "state"
    for name in ("admin-token", "provisioner-token", "ps-token", "ps-read-only-token", "admin.db"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
