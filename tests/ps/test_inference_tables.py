"""Inference tables and read-only tokens over gRPC.

An inference table refuses Update, MultiUpdate and MultiPull's carried updates
with FAILED_PRECONDITION and nothing changed, and takes Push (loading weights).
A node's read-only token may call Pull, MultiPull without updates, ListTables,
GetTableStats and ListCheckpoints; every other RPC is PERMISSION_DENIED for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.ps.serve.config import NodeConfig
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, spec

ADMIN, READER = "admin-s3cret", "reader-s3cret"
DIM = 8
REFUSAL = "table 'frozen' is an inference table: updates are refused"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_in_thread(
        "127.0.0.1", 0, data_dir=tmp_path, auth_token=ADMIN, read_only_token=READER
    )
    yield handle
    handle.stop()


@pytest.fixture
def admin(node: ServerHandle) -> Iterator[Client]:
    client = Client(node.address, ADMIN)
    client.create(spec("frozen", optimizer={"kind": "adagrad"}, mode="inference"))
    client.create(spec("trained", optimizer={"kind": "adagrad"}))
    yield client
    client.close()


@pytest.fixture
def reader(node: ServerHandle, admin: Client) -> Iterator[Client]:
    client = Client(node.address, READER)
    yield client
    client.close()


def _keys(*keys: int) -> bytes:
    return np.asarray(keys, "<i8").tobytes()


def _update(table: str, *keys: int) -> ps_pb2.UpdateRequest:
    grads = np.ones((len(keys), DIM), "<f4").tobytes()
    return ps_pb2.UpdateRequest(table=table, keys=_keys(*keys), grads=grads)


def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code(), raised.value.details()


def test_an_inference_table_refuses_every_update_and_changes_nothing(admin: Client) -> None:
    before = admin.pull("frozen", [1, 2, 3]).copy()
    code, details = _code(lambda: admin.call("Update", _update("frozen", 1, 2)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and REFUSAL in details
    multi = ps_pb2.MultiUpdateRequest(items=[_update("trained", 1), _update("frozen", 2)])
    code, details = _code(lambda: admin.call("MultiUpdate", multi))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == f"item 1: {REFUSAL}"
    carried = ps_pb2.MultiPullRequest(
        items=[ps_pb2.PullRequest(table="frozen", keys=_keys(1))], updates=[_update("frozen", 3)]
    )
    code, details = _code(lambda: admin.call("MultiPull", carried))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and REFUSAL in details
    np.testing.assert_array_equal(admin.pull("frozen", [1, 2, 3]), before)
    # the refused MultiUpdate applied none of its items, the training table's included
    trained = admin.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="trained"))
    assert trained.engine["step"] == 0


def test_an_inference_table_takes_pushed_weights(admin: Client) -> None:
    values = np.arange(2 * DIM, dtype="<f4").reshape(2, DIM)
    admin.push("frozen", [4, 5], values)
    np.testing.assert_array_equal(admin.pull("frozen", [4, 5]), values)


def test_a_read_only_token_reads(admin: Client, reader: Client) -> None:
    values = np.full((1, DIM), 2.5, "<f4")
    admin.push("frozen", [7], values)
    np.testing.assert_array_equal(reader.pull("frozen", [7]), values)
    assert sorted(reader.names()) == ["frozen", "trained"]
    assert reader.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="frozen")).size >= 1
    pulls = ps_pb2.MultiPullRequest(
        items=[
            ps_pb2.PullRequest(table="frozen", keys=_keys(7)),
            ps_pb2.PullRequest(table="trained", keys=_keys(1)),
        ]
    )
    reply = reader.call("MultiPull", pulls)
    np.testing.assert_array_equal(np.frombuffer(reply.items[0].values, "<f4"), values[0])
    reader.call("ListCheckpoints", ps_pb2.ListCheckpointsRequest())


@pytest.mark.parametrize(
    ("method", "request_of"),
    [
        ("Push", lambda: ps_pb2.PushRequest(table="trained", keys=_keys(1), values=bytes(4 * DIM))),
        ("Update", lambda: _update("trained", 1)),
        ("MultiUpdate", lambda: ps_pb2.MultiUpdateRequest(items=[_update("trained", 1)])),
        (
            "MultiPull",
            lambda: ps_pb2.MultiPullRequest(
                items=[ps_pb2.PullRequest(table="trained", keys=_keys(1))],
                updates=[_update("trained", 1)],
            ),
        ),
        (
            "CreateTable",
            lambda: ps_pb2.CreateTableRequest(spec_json=json.dumps(spec("new").to_wire())),
        ),
        ("DropTable", lambda: ps_pb2.DropTableRequest(table="trained")),
        ("Save", lambda: ps_pb2.SaveRequest()),
        ("Load", lambda: ps_pb2.LoadRequest()),
    ],
)
def test_a_read_only_token_may_not_write(
    admin: Client, reader: Client, method: str, request_of: Any
) -> None:
    before = admin.pull("trained", [1]).copy()
    code, details = _code(lambda: reader.call(method, request_of()))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "a read-only token may not call" in details
    np.testing.assert_array_equal(admin.pull("trained", [1]), before)
    assert sorted(admin.names()) == ["frozen", "trained"]
    stats = admin.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="trained"))
    assert stats.engine["step"] == 0


def test_other_tokens_are_still_unauthenticated(node: ServerHandle, admin: Client) -> None:
    stranger = Client(node.address, "guess")
    try:
        code, _ = _code(lambda: stranger.pull("frozen", [1]))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        stranger.close()


def test_a_read_only_token_needs_an_auth_token_and_another_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a read-only token needs an auth token"):
        NodeConfig(data_dir=tmp_path, read_only_token=READER)
    with pytest.raises(ValueError, match="must differ from the auth token"):
        NodeConfig(data_dir=tmp_path, auth_token=ADMIN, read_only_token=ADMIN)


def test_an_inference_table_is_checkpointed_without_state(admin: Client) -> None:
    values = np.arange(3 * DIM, dtype="<f4").reshape(3, DIM)
    admin.push("frozen", [1, 2, 3], values)
    checkpoint = admin.save()
    admin.push("frozen", [1, 2, 3], np.zeros((3, DIM), "<f4"))
    admin.call("Load", ps_pb2.LoadRequest(checkpoint_id=checkpoint.checkpoint_id))
    np.testing.assert_array_equal(admin.pull("frozen", [1, 2, 3]), values)
    code, _ = _code(lambda: admin.call("Update", _update("frozen", 1)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


def test_the_command_line_takes_a_read_only_token_file(tmp_path: Path, spawn: Any) -> None:
    (tmp_path / "admin").write_text(ADMIN + "\n")
    (tmp_path / "reader").write_text(READER + "\n")
    process = spawn(
        tmp_path / "data",
        "--auth-token-file", str(tmp_path / "admin"),
        "--read-only-token-file", str(tmp_path / "reader"),
    )  # fmt: skip
    admin, reader = Client(process.address, ADMIN), Client(process.address, READER)
    try:
        admin.create(spec("served", mode="inference"))
        values = np.ones((1, DIM), "<f4")
        admin.push("served", [1], values)
        np.testing.assert_array_equal(reader.pull("served", [1]), values)
        code, _ = _code(lambda: reader.push("served", [1], values))
        assert code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        admin.close()
        reader.close()
