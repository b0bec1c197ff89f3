"""Every RPC of a real in-process node, against a local engine table as the oracle."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from recstore.core import TableSpec
from recstore.store import Table
from recstore.v1 import ps_pb2, ps_pb2_grpc

from .conftest import Client, spec

RNG = np.random.default_rng(7)


def test_create_is_idempotent_and_conflicts_are_refused(client: Client) -> None:
    first = client.create(spec())
    assert first.created and first.stats.dim == 8 and first.stats.dtype == "float32"
    assert TableSpec.model_validate(json.loads(first.stats.spec_json)) == spec()
    assert first.stats.slot_map.epoch == 1
    assert not client.create(spec()).created
    with pytest.raises(grpc.RpcError) as info:
        client.create(spec(embedding_dim=16))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert client.names() == ["emb"]


def test_list_stats_and_drop(client: Client) -> None:
    client.create(spec("a"))
    client.create(spec("b", dtype="float16", keys={"mode": "hashed", "capacity": 64}))
    client.pull("a", [1, 2, 3])
    listed = client.call("ListTables", ps_pb2.ListTablesRequest())
    assert list(listed.names) == ["a", "b"]
    stats = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="a"))
    assert (stats.size, stats.capacity, stats.dim) == (3, 1000, 8)
    assert stats.memory_bytes >= 1000 * 8 * 4
    b = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="b"))
    assert (b.size, b.capacity, b.dtype) == (0, 64, "float16")
    client.call("DropTable", ps_pb2.DropTableRequest(table="a"))
    assert client.names() == ["b"]
    with pytest.raises(grpc.RpcError) as info:
        client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="a"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_pull_push_roundtrip(client: Client, dtype: str) -> None:
    table = spec(dtype=dtype, initializer={"kind": "normal", "seed": 3})
    client.create(table)
    oracle = Table(table)
    keys = np.array([0, 5, 999, 5, 17], dtype=np.int64)
    wire = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2"}[dtype]
    np.testing.assert_array_equal(client.pull("emb", keys, wire), oracle.pull(keys))
    values = (
        RNG.standard_normal((5, 8))
        .astype(np.float32)
        .astype(wire if dtype != "bfloat16" else "<f4")
    )
    if dtype == "bfloat16":
        values = (values.view(np.uint32) >> 16).astype("<u2")
    reply = client.push("emb", keys, values)
    oracle.push(keys, values)
    assert reply.rows == 5
    np.testing.assert_array_equal(client.pull("emb", keys, wire), oracle.pull(keys))


def test_read_only_pull_does_not_insert(client: Client) -> None:
    client.create(spec())
    client.push("emb", [4], np.full((1, 8), 2.0, np.float32))
    values, found = client.find("emb", [4, 9])
    assert found.tolist() == [True, False]
    np.testing.assert_array_equal(values, [[2.0] * 8, [0.0] * 8])
    stats = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    assert stats.size == 1


def test_update_sgd_matches_formula(client: Client) -> None:
    client.create(spec(initializer={"kind": "zeros"}, optimizer={"kind": "sgd", "lr": 0.5}))
    keys = np.array([1, 2, 1], dtype=np.int64)  # duplicate keys are summed
    grads = np.arange(24, dtype=np.float32).reshape(3, 8)
    client.update("emb", keys, grads)
    got = client.pull("emb", [1, 2])
    np.testing.assert_allclose(got, -0.5 * np.stack([grads[0] + grads[2], grads[1]]))
    client.update("emb", [2], np.ones((1, 8), np.float32), lr=2.0)  # per-call lr
    np.testing.assert_allclose(client.pull("emb", [2]), [-0.5 * grads[1] - 2.0])


@pytest.mark.parametrize("kind", ["adagrad", "rowwise_adagrad", "adam"])
def test_update_matches_engine(client: Client, kind: str) -> None:
    table = spec(optimizer={"kind": kind, "lr": 0.1})
    client.create(table)
    oracle = Table(table)
    for step in range(3):
        keys = RNG.integers(0, 50, 64).astype(np.int64)
        grads = RNG.standard_normal((64, 8)).astype(np.float32)
        client.update("emb", keys, grads)
        oracle.update(keys, grads)
        np.testing.assert_allclose(
            client.pull("emb", np.arange(50)),
            oracle.pull(np.arange(50)),
            rtol=1e-6,
            err_msg=str(step),
        )


def test_save_load_and_list_checkpoints(client: Client) -> None:
    client.create(spec(optimizer={"kind": "adam"}))
    keys = np.arange(100)
    saved_values = RNG.standard_normal((100, 8)).astype(np.float32)
    client.push("emb", keys, saved_values)
    client.update("emb", keys[:10], np.ones((10, 8), np.float32))
    expected = client.pull("emb", keys)
    first = client.save("before")
    assert (first.checkpoint_id, first.rows, list(first.tables)) == ("before", 100, ["emb"])
    client.push("emb", keys, np.zeros((100, 8), np.float32))
    client.pull("emb", [500])
    loaded = client.call("Load", ps_pb2.LoadRequest(checkpoint_id="before")).checkpoint
    assert loaded.checkpoint_id == "before"
    np.testing.assert_array_equal(client.pull("emb", keys), expected)
    _, found = client.find("emb", [500])
    assert not found[0]  # rows created after the checkpoint are gone
    second = client.save()
    listed = client.call("ListCheckpoints", ps_pb2.ListCheckpointsRequest()).checkpoints
    assert [c.checkpoint_id for c in listed] == ["before", second.checkpoint_id]
    # paths relative to the node's data dir: no reply tells a caller the node's file layout
    assert [first.path, loaded.path] == ["checkpoints/before", "checkpoints/before"]
    assert [c.path for c in listed] == [f"checkpoints/{c.checkpoint_id}" for c in listed]
    with pytest.raises(grpc.RpcError) as info:
        client.call("Load", ps_pb2.LoadRequest(checkpoint_id="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_and_reflection(client: Client) -> None:
    health = health_pb2_grpc.HealthStub(client.channel)
    for service in ("", "recstore.v1.ParameterServer"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(client.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = list(reflection.ServerReflectionInfo(iter([request]), timeout=10))
    names = {s.name for s in reply.list_services_response.service}
    assert {"recstore.v1.ParameterServer", "grpc.health.v1.Health"} <= names


def test_the_servicer_implements_every_method_of_the_contract() -> None:
    """The generated base class answers UNIMPLEMENTED; the node overrides every method."""
    from recstore.ps.serve.servicer import PsServicer

    methods = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].methods_by_name
    generated = ps_pb2_grpc.ParameterServerServicer
    missing = [m for m in methods if getattr(PsServicer, m) is getattr(generated, m)]
    assert not missing, f"PsServicer leaves {missing} to the generated stub"
