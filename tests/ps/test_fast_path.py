"""The zero-copy data path: raw-bytes handlers on the node, ``WireClient`` on the caller.

Both ends must speak plain protobuf: the generated stub works against the fast
node, ``WireClient`` works against a node written with the generated classes,
and what each side writes parses on the other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core import wire
from recstore.core.wire import WireClient
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.store import Table
from recstore.v1 import ps_pb2, ps_pb2_grpc

from .conftest import Client, spec


@pytest.fixture
def fast(node: ServerHandle) -> Iterator[WireClient]:
    with grpc.insecure_channel(node.address) as channel:
        yield WireClient(channel, timeout=60)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_wire_client_and_stub_agree_with_the_engine(
    client: Client, fast: WireClient, dtype: str
) -> None:
    table = spec(dtype=dtype, optimizer={"kind": "adagrad", "lr": 0.1})
    client.create(table)
    oracle = Table(table)
    storage = wire.WIRE_DTYPES[dtype]
    keys = np.array([3, 999, 0, 3, 42], dtype=np.int64)
    values, found = fast.pull("emb", keys)
    assert found is None and values.dtype == storage
    np.testing.assert_array_equal(values, oracle.pull(keys))
    rows = np.arange(5 * 8).reshape(5, 8).astype(storage)
    assert fast.push("emb", keys[:3], rows[:3]) == 3
    oracle.push(keys[:3], rows[:3])
    grads = np.linspace(-1, 1, 5 * 8, dtype=np.float32).reshape(5, 8)
    assert fast.update("emb", keys, grads, lr=0.5) == 5
    oracle.update(keys, grads, lr=0.5)
    np.testing.assert_array_equal(client.pull("emb", keys, storage.str), oracle.pull(keys))
    np.testing.assert_array_equal(fast.pull("emb", keys)[0], oracle.pull(keys))


def test_read_only_pull_reports_found_rows(client: Client, fast: WireClient) -> None:
    client.create(spec())
    client.push("emb", [7], np.full((1, 8), 2.0, np.float32))
    values, found = fast.pull("emb", [7, 8], read_only=True)
    assert found is not None and found.tolist() == [True, False]
    np.testing.assert_array_equal(values, [[2.0] * 8, [0.0] * 8])
    stats = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    assert stats.size == 1  # a read-only pull inserts nothing


def test_generated_messages_go_through_the_raw_handlers(node: ServerHandle, client: Client) -> None:
    client.create(spec())
    with grpc.insecure_channel(node.address) as channel:
        pull = channel.unary_unary(wire.PULL)
        keys = np.array([1, 2], np.int64).tobytes()
        request = ps_pb2.PullRequest(table="emb", keys=keys, read_only=True)
        reply = ps_pb2.PullResponse.FromString(pull(request.SerializeToString(), timeout=60))
    assert (reply.dim, reply.dtype, reply.found) == (8, "float32", b"\x00\x00")
    assert reply.values == bytes(2 * 8 * 4)


ALL = (wire.PULL, wire.PUSH, wire.UPDATE)


@pytest.mark.parametrize(
    ("request_bytes", "methods"),
    [
        (b"\x0f", ALL),  # invalid wire type
        (b"\x0a\x03em", ALL),  # table name cut short
        (b"\x0a\x03emb\x1a\x05" + bytes(5), ALL),  # keys not a whole number of int64
        (b"\x0a\x03emb\x1a\x10" + bytes(16) + b"\x22\x04" + bytes(4), ALL[1:]),  # short rows
        (b"\x0a\x03emb\x1a\x08" + bytes(8) + b"\x22\x20" + bytes(32) + b"\x35" + bytes(4),
         ALL[2:]),  # lr 0.0: not positive
    ],
)  # fmt: skip
def test_malformed_bytes_are_invalid_and_change_nothing(
    node: ServerHandle, client: Client, request_bytes: bytes, methods: tuple[str, ...]
) -> None:
    client.create(spec())
    with grpc.insecure_channel(node.address) as channel:
        for method in methods:
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(method)(request_bytes, timeout=60)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
    stats = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    assert stats.size == 0


def test_wire_client_errors_are_the_documented_statuses(tmp_path: Path) -> None:
    with start_in_thread(data_dir=tmp_path, shard_index=0, num_shards=2, auth_token="s3") as handle:
        Client(handle.address, token="s3").create(spec(shards=2))
        with grpc.insecure_channel(handle.address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                WireClient(channel).pull("emb", [1])
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            authed = WireClient(channel, metadata=[("authorization", "Bearer s3")])
            with pytest.raises(grpc.RpcError) as info:
                authed.pull("nope", [1])
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.RpcError) as info:
                authed.update("emb", np.arange(64), np.zeros((64, 8), np.float32))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert ("x-recstore-epoch", "1") in info.value.trailing_metadata()


class GeneratedServer(ps_pb2_grpc.ParameterServerServicer):
    """A reference node written only with the generated classes; it records requests."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def Pull(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        rows = np.frombuffer(request.keys, "<i8").astype(np.float32)[:, None] * np.ones(4)
        return ps_pb2.PullResponse(
            values=rows.astype(np.float32).tobytes(),
            dim=4,
            dtype="float32",
            found=b"\x01" * len(rows),
        )

    def Push(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        return ps_pb2.PushResponse(rows=len(request.keys) // 8)

    def Update(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        return ps_pb2.UpdateResponse(rows=len(request.keys) // 8)


def test_wire_client_speaks_to_a_generated_server() -> None:
    reference = GeneratedServer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ps_pb2_grpc.add_ParameterServerServicer_to_server(reference, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            client = WireClient(channel, timeout=60)
            keys = np.array([5, -1, 2**40], np.int64)
            values, found = client.pull("t", keys, epoch=3, read_only=True)
            np.testing.assert_array_equal(values[:, 0], keys.astype(np.float32))
            assert found is not None and found.all()
            rows = np.ones((3, 4), np.float16)
            assert client.push("t", keys, rows, epoch=4) == 3
            assert client.update("t", keys, rows.astype(np.float32), lr=0.25) == 3
    finally:
        server.stop(None)
    pull, push, update = reference.seen
    assert pull == ps_pb2.PullRequest(table="t", epoch=3, keys=keys.tobytes(), read_only=True)
    assert push == ps_pb2.PushRequest(
        table="t", epoch=4, keys=keys.tobytes(), values=rows.tobytes(), dtype="float16", dim=4
    )
    assert update == ps_pb2.UpdateRequest(
        table="t", keys=keys.tobytes(), grads=rows.astype(np.float32).tobytes(),
        grad_dtype="float32", dim=4, lr=0.25,
    )  # fmt: skip


def test_concurrent_fast_pulls_and_updates_stay_consistent(
    node: ServerHandle, client: Client
) -> None:
    client.create(spec(initializer={"kind": "zeros"}))
    keys = np.arange(0, 1000, dtype=np.int64)
    ones = np.ones((1000, 8), np.float32)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with grpc.insecure_channel(node.address) as channel:
                c = WireClient(channel, timeout=60)
                for _ in range(5):
                    c.update("emb", keys, ones, lr=1.0)
                    assert c.pull("emb", keys)[0].shape == (1000, 8)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    np.testing.assert_array_equal(client.pull("emb", keys), np.full((1000, 8), -20.0))
