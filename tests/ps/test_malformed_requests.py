"""Bytes that are not the method's message: INVALID_ARGUMENT and one warning line, on every RPC.

The data path reads its requests natively, the control RPCs with the generated
classes; either way a malformed request is the sender's fault, answered like
any bad input (nothing is read, so nothing changes) and logged as one warning,
never as gRPC's deserializer error with a traceback. Request streams too
(ImportRows), whichever message of the stream is malformed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, spec
from .test_bad_input import snapshot

SERVICE = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
METHODS = [method.name for method in SERVICE.methods]
MALFORMED = {
    "truncated": b"\x0a\x05ab",  # field 1 says 5 bytes follow, 2 do
    "bad wire type": b"\x0f",  # wire type 7 does not exist
    "varint never ends": b"\x08" + b"\xff" * 11,
}
TOKEN = "node-token"


@pytest.fixture
def guarded(tmp_path: Any) -> Iterator[tuple[ServerHandle, Client]]:
    """A node that requires a token, holding one table with rows."""
    handle = start_in_thread(data_dir=tmp_path / "node", auth_token=TOKEN)
    client = Client(handle.address, token=TOKEN)
    client.create(spec(optimizer={"kind": "adagrad"}))
    client.push("emb", np.arange(10), np.full((10, 8), 3.0, np.float32))
    yield handle, client
    client.close()
    handle.stop(final_checkpoint=False)


def _send(client: Client, name: str, data: bytes) -> grpc.RpcError:
    path = f"/{SERVICE.full_name}/{name}"
    method = SERVICE.methods_by_name[name]
    options: dict[str, Any] = {"metadata": client.metadata, "timeout": 30}
    with pytest.raises(grpc.RpcError) as refused:
        if method.client_streaming:  # a good chunk first: the malformed one is not the first
            good = ps_pb2.ExportRowsChunk(table="emb").SerializeToString()  # 0 rows
            client.channel.stream_unary(path)(iter([good, data]), **options)
        elif method.server_streaming:
            list(client.channel.unary_stream(path)(data, **options))
        else:
            client.channel.unary_unary(path)(data, **options)
    return refused.value


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_bytes_to_every_rpc_are_invalid_argument_with_one_warning(
    guarded: tuple[ServerHandle, Client], caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    _, client = guarded
    before = snapshot(client)
    checkpoints = client.call("ListCheckpoints", ps_pb2.ListCheckpointsRequest())
    for name in METHODS:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            error = _send(client, name, MALFORMED[kind])
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error.details())
        assert error.details(), name
        (record,) = caplog.records  # one line, a warning, no traceback
        assert record.levelno == logging.WARNING and record.exc_info is None, name
        assert record.getMessage().startswith(f"{name} refused: "), record.getMessage()
    assert snapshot(client) == before
    assert client.call("ListCheckpoints", ps_pb2.ListCheckpointsRequest()) == checkpoints


def test_a_malformed_control_request_says_which_message_it_is_not(
    guarded: tuple[ServerHandle, Client],
) -> None:
    _, client = guarded
    error = _send(client, "DropTable", MALFORMED["truncated"])
    assert error.details().startswith("malformed recstore.v1.DropTableRequest (4 bytes): ")
    assert "emb" in client.names()


def test_malformed_bytes_without_the_token_are_never_read(
    guarded: tuple[ServerHandle, Client], caplog: pytest.LogCaptureFixture
) -> None:
    handle, _ = guarded
    stranger = Client(handle.address)
    try:
        with caplog.at_level(logging.WARNING):
            for name in METHODS:
                code = _send(stranger, name, MALFORMED["truncated"]).code()
                assert code == grpc.StatusCode.UNAUTHENTICATED, name
        assert not caplog.records
    finally:
        stranger.close()
