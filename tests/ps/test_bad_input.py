# ruff: noqa: E501  (one bad request per line reads best as a table)
"""Every rejected request gets its status code and leaves every table as it was."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core import SlotMap, slot_of
from recstore.ps.serve.server import start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, spec

K = np.arange(4, dtype="<i8").tobytes()
V = np.ones((4, 8), "<f4").tobytes()
INVALID = grpc.StatusCode.INVALID_ARGUMENT
SPEC_Z = '{"name": "z", "numEmbeddings": 10, "embeddingDim": 8, %s}'

BAD_REQUESTS: list[tuple[str, str, Any, grpc.StatusCode]] = [
    ("pull unknown table", "Pull", ps_pb2.PullRequest(table="nope", keys=K), grpc.StatusCode.NOT_FOUND),
    ("push unknown table", "Push", ps_pb2.PushRequest(table="nope", keys=K, values=V), grpc.StatusCode.NOT_FOUND),
    ("drop unknown table", "DropTable", ps_pb2.DropTableRequest(table="nope"), grpc.StatusCode.NOT_FOUND),
    ("keys not int64-sized", "Pull", ps_pb2.PullRequest(table="emb", keys=K[:-1]), INVALID),
    ("push values too short", "Push", ps_pb2.PushRequest(table="emb", keys=K, values=V[:-4]), INVALID),
    ("push values too long", "Push", ps_pb2.PushRequest(table="emb", keys=K, values=V + V), INVALID),
    ("push declared dtype", "Push", ps_pb2.PushRequest(table="emb", keys=K, values=V, dtype="float16"), INVALID),
    ("push declared dim", "Push", ps_pb2.PushRequest(table="emb", keys=K, values=V, dim=4), INVALID),
    ("push dense id too big", "Push", ps_pb2.PushRequest(table="emb", keys=np.array([1, 1000], "<i8").tobytes(), values=V[:64]), INVALID),
    ("pull negative dense id", "Pull", ps_pb2.PullRequest(table="emb", keys=np.array([3, -1], "<i8").tobytes()), INVALID),
    ("update grads short", "Update", ps_pb2.UpdateRequest(table="emb", keys=K, grads=V[:-1]), INVALID),
    ("update grad dtype", "Update", ps_pb2.UpdateRequest(table="emb", keys=K, grads=V, grad_dtype="float16"), INVALID),
    ("update negative lr", "Update", ps_pb2.UpdateRequest(table="emb", keys=K, grads=V, lr=-1.0), INVALID),
    ("update nan lr", "Update", ps_pb2.UpdateRequest(table="emb", keys=K, grads=V, lr=float("nan")), INVALID),
    ("spec not json", "CreateTable", ps_pb2.CreateTableRequest(spec_json="{"), INVALID),
    ("spec invalid", "CreateTable", ps_pb2.CreateTableRequest(spec_json=json.dumps({"name": "x", "num_embeddings": 0, "embedding_dim": 8})), INVALID),
    ("spec shards mismatch", "CreateTable", ps_pb2.CreateTableRequest(spec_json=json.dumps(spec("y", shards=2).to_wire())), INVALID),
    ("spec nested 100k deep", "CreateTable", ps_pb2.CreateTableRequest(spec_json="[" * 100_000 + "]" * 100_000), INVALID),
    ("spec deep in a field", "CreateTable", ps_pb2.CreateTableRequest(spec_json='{"name": "z", "numEmbeddings": ' + "[" * 5000 + "]" * 5000 + "}"), INVALID),
    ("spec lr NaN", "CreateTable", ps_pb2.CreateTableRequest(spec_json=SPEC_Z % '"optimizer": {"lr": NaN}'), INVALID),
    ("spec lr Infinity", "CreateTable", ps_pb2.CreateTableRequest(spec_json=SPEC_Z % '"optimizer": {"lr": Infinity}'), INVALID),
    ("spec std 1e400", "CreateTable", ps_pb2.CreateTableRequest(spec_json=SPEC_Z % '"initializer": {"std": 1e400}'), INVALID),
    ("spec mean -Infinity", "CreateTable", ps_pb2.CreateTableRequest(spec_json=SPEC_Z % '"initializer": {"mean": -Infinity}'), INVALID),
    ("spec weight decay inf", "CreateTable", ps_pb2.CreateTableRequest(spec_json=json.dumps({"name": "z", "numEmbeddings": 10, "embeddingDim": 8, "optimizer": {"weightDecay": float("inf")}})), INVALID),
    ("load bad id", "Load", ps_pb2.LoadRequest(checkpoint_id="../etc"), grpc.StatusCode.NOT_FOUND),
    ("save bad id", "Save", ps_pb2.SaveRequest(checkpoint_id="a/b"), INVALID),
]  # fmt: skip


def snapshot(client: Client, keys: Any = None) -> dict[str, Any]:
    tables = client.call("ListTables", ps_pb2.ListTablesRequest()).tables
    keys = np.arange(1000) if keys is None else keys
    return {
        t.table: (
            t.size,
            client.find(t.table, keys)[0].tobytes(),
            client.find(t.table, keys)[1].tobytes(),
        )
        for t in tables
    }


@pytest.mark.parametrize(
    ("method", "request_", "code"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_bad_request_is_refused_and_changes_nothing(client: Client, method: str, request_: Any, code: grpc.StatusCode) -> None:  # fmt: skip
    client.create(spec(optimizer={"kind": "adagrad"}))
    client.push("emb", np.arange(10), np.full((10, 8), 3.0, np.float32))
    before = snapshot(client)
    with pytest.raises(grpc.RpcError) as info:
        client.call(method, request_)
    assert info.value.code() == code, info.value.details()
    assert info.value.details()  # a specific message, not an empty status
    assert snapshot(client) == before


def test_full_hashed_table_is_resource_exhausted(client: Client) -> None:
    client.create(spec("h", keys={"mode": "hashed", "capacity": 8}))
    client.push("h", np.arange(6) * 1001, np.ones((6, 8), np.float32))
    before = snapshot(client)
    for call in (
        lambda: client.pull("h", np.arange(20) * 7),
        lambda: client.push("h", np.arange(20) * 7, np.ones((20, 8), np.float32)),
        lambda: client.update("h", np.arange(20) * 7, np.ones((20, 8), np.float32)),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert snapshot(client) == before


def test_auth_token(tmp_path: Path) -> None:
    handle = start_in_thread(data_dir=tmp_path, auth_token="s3cret")
    try:
        calls: list[Callable[[Client], Any]] = [
            lambda c: c.names(),
            lambda c: c.create(spec()),
            lambda c: c.pull("emb", [1]),
        ]
        for token in (None, "wrong"):
            denied = Client(handle.address, token)
            for call in calls:
                with pytest.raises(grpc.RpcError) as info:
                    call(denied)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        allowed = Client(handle.address, "s3cret")
        assert allowed.names() == []  # nothing was created by the refused calls
        allowed.create(spec())
        assert allowed.pull("emb", [1]).shape == (1, 8)
    finally:
        handle.stop(final_checkpoint=False)


def test_keys_of_other_shards_are_refused_with_epoch(tmp_path: Path) -> None:
    handle = start_in_thread(data_dir=tmp_path, shard_index=1, num_shards=2)
    try:
        client = Client(handle.address)
        client.create(spec(shards=2))
        owners = SlotMap.initial(2).owner_table()[slot_of(np.arange(1000))]
        mine, theirs = np.flatnonzero(owners == 1)[:5], np.flatnonzero(owners == 0)[:1]
        client.push("emb", mine, np.ones((5, 8), np.float32))
        owned = np.flatnonzero(owners == 1)
        before = snapshot(client, owned)
        mixed = np.concatenate([mine, theirs])
        for call in (
            lambda: client.pull("emb", mixed),
            lambda: client.push("emb", mixed, np.zeros((6, 8), np.float32)),
            lambda: client.update("emb", mixed, np.ones((6, 8), np.float32)),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert ("x-recstore-epoch", "1") in tuple(info.value.trailing_metadata())
        assert snapshot(client, owned) == before
        np.testing.assert_array_equal(client.pull("emb", mine), np.ones((5, 8)))
    finally:
        handle.stop(final_checkpoint=False)


@pytest.mark.parametrize(
    ("field", "value"),
    [("optimizer.lr", "Infinity"), ("initializer.mean", "NaN"), ("initializer.std", "1e400"),
     ("optimizer.weightDecay", "Infinity"), ("optimizer.eps", "-Infinity")],
)  # fmt: skip
def test_a_non_finite_hyper_parameter_is_refused_naming_it(
    client: Client, field: str, value: str
) -> None:
    group, name = field.split(".")
    for spec_json in (
        SPEC_Z
        % f'"{group}": {{"{name}": {value}}}',  # the literal, as a careless encoder writes it
        json.dumps(json.loads(SPEC_Z % f'"{group}": {{"{name}": {value}}}')),  # python's json too
    ):
        with pytest.raises(grpc.RpcError) as info:
            client.call("CreateTable", ps_pb2.CreateTableRequest(spec_json=spec_json))
        assert info.value.code() == INVALID
        assert "must be finite" in info.value.details() or (
            field in info.value.details() and "finite number" in info.value.details()
        ), info.value.details()
    assert client.names() == []
