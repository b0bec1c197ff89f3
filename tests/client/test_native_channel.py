"""The SDK's native data channel: gRPC C++ in the trainer's process, next to grpcio.

grpcio's module and the system libgrpc++ each carry a gRPC core; some versions
crash when both run in one process (grpc#35947, grpc#39000). Here they share
it under load: in-thread nodes served by grpcio, SDK pulls and updates on the
native channel from several threads, and grpcio clients (control calls and raw
MultiPulls) at the same time; every reply must be exact. The channel's own
edges (a deadline, a status with its trailing metadata, a closed channel) are
checked against a grpcio server that answers as a test says.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest
import torch

from recstore.client.remote.backend import GrpcBackend
from recstore.client.remote.native_channel import DataChannel, NativeRpcError
from recstore.core import TableSpec, wire
from recstore.core.limits import grpc_options
from tests.client.conftest import unique_name

ROWS, DIM = 1 << 14, 64


def test_grpcio_and_the_native_channel_share_the_process_under_load(
    ps_endpoints: list[str],
) -> None:
    backend = GrpcBackend(endpoints=tuple(ps_endpoints), rpc_timeout=60)
    name = unique_name("coexist")
    backend.create_table(TableSpec(name=name, num_embeddings=ROWS, embedding_dim=DIM))
    keys = torch.arange(ROWS, dtype=torch.int64)
    values = torch.arange(ROWS * DIM, dtype=torch.float32).reshape(ROWS, DIM) / DIM
    backend.push(name, keys, values)
    stop = threading.Event()
    start = threading.Barrier(6)
    failures: list[BaseException] = []

    def native_puller(seed: int) -> None:
        rng = np.random.default_rng(seed)
        start.wait()
        for _ in range(40):
            ids = torch.from_numpy(rng.choice(ROWS, 4096, replace=False))
            assert torch.equal(backend.pull(name, ids), values[ids])

    def native_updater() -> None:  # a table of its own: the pulled one stays exact
        other = unique_name("coexist_upd")
        backend.create_table(TableSpec(name=other, num_embeddings=ROWS, embedding_dim=DIM))
        ids = torch.arange(0, ROWS, 4, dtype=torch.int64)
        start.wait()
        for _ in range(40):
            backend.update(other, ids, torch.ones(len(ids), DIM), lr=1.0)
        pulled = backend.pull(other, ids)
        assert torch.all(pulled < 0)  # every update applied: rows went down from their init

    def grpcio_client(endpoint: str) -> None:
        from recstore.v1 import ps_pb2, ps_pb2_grpc

        with grpc.insecure_channel(endpoint, options=grpc_options()) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            multi_pull = channel.unary_unary(wire.MULTI_PULL)
            epoch = stub.GetTableStats(ps_pb2.GetTableStatsRequest(table=name)).slot_map.epoch
            item = ps_pb2.PullRequest(table=name, epoch=epoch, keys=b"")  # version only
            request = ps_pb2.MultiPullRequest(items=[item]).SerializeToString()
            start.wait()
            while not stop.is_set():
                assert stub.GetTableStats(ps_pb2.GetTableStatsRequest(table=name)).table == name
                reply = ps_pb2.MultiPullResponse.FromString(multi_pull(request))
                assert len(reply.items) == 1

    def run(work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as error:
            failures.append(error)
            start.abort()

    loaders = [lambda s=s: native_puller(s) for s in range(3)] + [native_updater]
    watchers = [lambda e=e: grpcio_client(e) for e in ps_endpoints]
    threads = [threading.Thread(target=run, args=(w,)) for w in loaders + watchers]
    for thread in threads:
        thread.start()
    for thread in threads[: len(loaders)]:
        thread.join(timeout=300)
    stop.set()
    for thread in threads[len(loaders) :]:
        thread.join(timeout=60)
    # the SDK's data calls went through the native channel, next to grpcio's
    assert all(isinstance(node.data, DataChannel) for node in backend._nodes.values())
    backend.close()
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads)


class Answers:
    """A grpcio server whose every call on /t.T/M is answered by ``answer``."""

    def __init__(self) -> None:
        self.answer: Callable[[bytes, grpc.ServicerContext], bytes] = lambda r, c: r
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.unary_unary_rpc_method_handler(lambda r, c: self.answer(r, c))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("t.T", {"M": handler}),)
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


@pytest.fixture
def answers() -> Iterator[Answers]:
    served = Answers()
    yield served
    served.server.stop(None)


def call(channel: DataChannel, request: bytes, timeout: float = 10) -> bytes:
    return channel.call("/t.T/M", request, timeout=timeout, metadata=(("x-who", "test"),),
                        wait_for_ready=True)  # fmt: skip


def test_a_reply_and_the_metadata_sent(answers: Answers) -> None:
    seen: list[tuple[bytes, dict[str, str]]] = []

    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append((request, dict(context.invocation_metadata())))
        return request[::-1]

    answers.answer = answer
    channel = DataChannel(answers.address, None, grpc_options())
    big = bytes(range(256)) * (8 << 10)  # 2 MiB, several slices on the way back
    assert call(channel, big) == big[::-1]
    assert call(channel, b"") == b""
    assert seen[0][0] == big and seen[0][1]["x-who"] == "test"


def test_a_failure_reads_as_grpcio_reports_it(answers: Answers) -> None:
    def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata((("x-recstore-epoch", "7"), ("x-blob-bin", b"\x00\x01")))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the owner")

    answers.answer = refuse
    channel = DataChannel(answers.address, None, grpc_options())
    with pytest.raises(NativeRpcError) as raised:
        call(channel, b"x")
    error = raised.value
    assert isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == "not the owner"
    assert ("x-recstore-epoch", "7") in error.trailing_metadata()
    assert ("x-blob-bin", b"\x00\x01") in error.trailing_metadata()


def test_the_deadline_ends_a_call_the_server_holds(answers: Answers) -> None:
    release = threading.Event()

    def hold(request: bytes, context: grpc.ServicerContext) -> bytes:
        release.wait(timeout=60)
        return request

    answers.answer = hold
    channel = DataChannel(answers.address, None, grpc_options())
    try:
        with pytest.raises(NativeRpcError) as raised:
            call(channel, b"x", timeout=0.2)
        assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        release.set()


def test_a_closed_channel_starts_no_call(answers: Answers) -> None:
    channel = DataChannel(answers.address, None, grpc_options())
    assert call(channel, b"up") == b"up"
    channel.close()
    with pytest.raises(RuntimeError, match="closed"):
        call(channel, b"x")


def test_calls_started_together_are_in_flight_together() -> None:
    """Two servers that each answer only once both have a request: waiting for the first
    call must already have sent the second (it was started, not queued behind the first),
    on two channels as a multi call's nodes are; each reply is its own."""
    arrived = threading.Barrier(2, timeout=20)
    servers = [Answers(), Answers()]
    try:
        for served in servers:

            def both_in(request: bytes, context: grpc.ServicerContext) -> bytes:
                arrived.wait()  # broken (an error) when the other never arrives
                return request + b"!"

            served.answer = both_in
        channels = [DataChannel(s.address, None, grpc_options()) for s in servers]
        requests = [bytes([i]) * (1 << 20) for i in range(2)]
        started = [
            channel.start("/t.T/M", request, timeout=30, metadata=(), wait_for_ready=True)
            for channel, request in zip(channels, requests, strict=True)
        ]
        assert [pending.wait() for pending in started] == [r + b"!" for r in requests]
    finally:
        for served in servers:
            served.server.stop(None)
