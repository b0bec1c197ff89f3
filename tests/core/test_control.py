"""The control-plane clients against a real gRPC server on loopback.

The server double records what each call carried (request, token, deadline)
and answers from ``replies``, or aborts with the status set in ``failures``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from recstore.core import SlotMap, TableSpec
from recstore.core.control import (
    DEFAULT_TIMEOUT,
    AsyncControlClient,
    ControlClient,
    ControlError,
    Created,
    create_table_rpc,
    drop_table_rpc,
    load_rpc,
    save_rpc,
    stats_rpc,
)
from recstore.core.proto_convert import (
    SavedCheckpoint,
    TableStats,
    checkpoint_to_proto,
    read_create_table_request,
    table_stats_to_proto,
)
from recstore.v1 import ps_pb2, ps_pb2_grpc

SPEC = TableSpec(name="clicks", num_embeddings=100, embedding_dim=4, shards=2)
STATS = TableStats(
    table="clicks", size=5, capacity=100, memory_bytes=800, dtype="float32", dim=4, spec=SPEC,
    shard_index=1, num_shards=2, slot_map=SlotMap.initial(2), engine={"inserts": 5.0},
)  # fmt: skip
CHECKPOINT = SavedCheckpoint("c-1", "/ckpt/c-1", 3, 1.5, ("clicks",), 5, 64)


@dataclass
class Seen:
    method: str
    request: Any
    token: str | None
    time_remaining: float | None


@dataclass
class NodeDouble(ps_pb2_grpc.ParameterServerServicer):
    seen: list[Seen] = field(default_factory=list)
    failures: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)

    def _answer(self, method: str, request: Any, context: Any, reply: Any) -> Any:
        token = dict(context.invocation_metadata()).get("authorization")
        self.seen.append(Seen(method, request, token, context.time_remaining()))
        if method in self.failures:
            context.abort(*self.failures[method])
        return reply

    def CreateTable(self, request, context):
        created = ps_pb2.CreateTableResponse(created=True, stats=table_stats_to_proto(STATS))
        return self._answer("CreateTable", request, context, created)

    def DropTable(self, request, context):
        return self._answer("DropTable", request, context, ps_pb2.DropTableResponse())

    def GetTableStats(self, request, context):
        return self._answer("GetTableStats", request, context, table_stats_to_proto(STATS))

    def Save(self, request, context):
        reply = ps_pb2.SaveResponse(checkpoint=checkpoint_to_proto(CHECKPOINT))
        return self._answer("Save", request, context, reply)

    def Load(self, request, context):
        reply = ps_pb2.LoadResponse(checkpoint=checkpoint_to_proto(CHECKPOINT))
        return self._answer("Load", request, context, reply)


@pytest.fixture
def node() -> Iterator[tuple[NodeDouble, str]]:
    double = NodeDouble()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ps_pb2_grpc.add_ParameterServerServicer_to_server(double, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield double, f"127.0.0.1:{port}"
    server.stop(None)


def test_each_call_sends_its_request_and_reads_its_reply(node: tuple[NodeDouble, str]) -> None:
    double, endpoint = node
    slot_map = SlotMap.initial(2)
    with ControlClient(endpoint, token="s3cret", timeout=5.0) as client:
        assert client.create_table(SPEC, slot_map) == Created(True, STATS)
        assert client.stats("clicks") == STATS
        assert client.save("c-1") == CHECKPOINT
        assert client.load() == CHECKPOINT
        assert client.drop_table("clicks") is None
    methods = [s.method for s in double.seen]
    assert methods == ["CreateTable", "GetTableStats", "Save", "Load", "DropTable"]
    assert read_create_table_request(double.seen[0].request) == (SPEC, slot_map)
    assert double.seen[1].request.table == "clicks" and double.seen[4].request.table == "clicks"
    assert double.seen[2].request.checkpoint_id == "c-1"
    assert double.seen[3].request.checkpoint_id == ""
    assert all(s.token == "Bearer s3cret" for s in double.seen)


def test_deadlines_default_and_per_call(node: tuple[NodeDouble, str]) -> None:
    double, endpoint = node
    with ControlClient(endpoint) as client:
        client.stats("clicks")
        client.save("c-1", timeout=500.0)
    default, per_call = (s.time_remaining for s in double.seen)
    assert default is not None and DEFAULT_TIMEOUT - 5 < default <= DEFAULT_TIMEOUT + 1
    assert per_call is not None and 495 < per_call <= 501
    assert double.seen[0].token is None  # no token: no authorization metadata


@pytest.mark.parametrize(
    ("method", "call", "code"),
    [
        ("CreateTable", lambda c: c.create_table(SPEC), grpc.StatusCode.ALREADY_EXISTS),
        ("GetTableStats", lambda c: c.stats("nope"), grpc.StatusCode.NOT_FOUND),
        ("Save", lambda c: c.save("c-1"), grpc.StatusCode.UNAVAILABLE),
        ("Load", lambda c: c.load("c-2"), grpc.StatusCode.NOT_FOUND),
        ("DropTable", lambda c: c.drop_table("clicks"), grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_failures_raise_control_error(
    node: tuple[NodeDouble, str], method: str, call: Any, code: grpc.StatusCode
) -> None:
    double, endpoint = node
    double.failures[method] = (code, "it went wrong")
    with ControlClient(endpoint) as client, pytest.raises(ControlError) as raised:
        call(client)
    error = raised.value
    assert (error.code, error.details, error.method) == (code, "it went wrong", method)
    assert error.endpoint == endpoint and str(error) == f"{code.name}: it went wrong"
    assert isinstance(error.__cause__, grpc.RpcError)


def test_an_unreachable_node_is_a_control_error() -> None:
    with ControlClient("127.0.0.1:1", timeout=2.0) as client, pytest.raises(ControlError) as raised:
        client.stats("clicks")
    assert raised.value.code in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def test_a_given_channel_is_used_and_left_open(node: tuple[NodeDouble, str]) -> None:
    double, endpoint = node
    with grpc.insecure_channel(endpoint) as channel:
        with ControlClient(endpoint, channel=channel, token="t") as client:
            client.stats("clicks")
        ps_pb2_grpc.ParameterServerStub(channel).GetTableStats(
            ps_pb2.GetTableStatsRequest(table="clicks"), timeout=5
        )  # still open
    assert [s.token for s in double.seen] == ["Bearer t", None]


async def test_the_async_client_makes_the_same_calls(node: tuple[NodeDouble, str]) -> None:
    double, endpoint = node
    double.failures["Load"] = (grpc.StatusCode.NOT_FOUND, "no checkpoint c-9")
    async with AsyncControlClient(endpoint, token="s3cret", timeout=7.0) as client:
        assert await client.call(create_table_rpc(SPEC)) == Created(True, STATS)
        assert await client.call(stats_rpc("clicks")) == STATS
        assert await client.call(save_rpc("c-1"), timeout=60.0) == CHECKPOINT
        assert await client.call(drop_table_rpc("clicks")) is None
        with pytest.raises(ControlError, match="NOT_FOUND: no checkpoint c-9") as raised:
            await client.call(load_rpc("c-9"))
    assert raised.value.method == "Load" and raised.value.endpoint == endpoint
    assert read_create_table_request(double.seen[0].request) == (SPEC, None)
    assert all(s.token == "Bearer s3cret" for s in double.seen)
    remaining = [s.time_remaining or 0.0 for s in double.seen]
    assert 2 < remaining[0] <= 8 and 55 < remaining[2] <= 61  # deadlines are rounded up
