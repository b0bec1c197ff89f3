"""The node's gRPC server in C++: pulls it answers itself, and the edges of its calls.

The oracle of the fast path is the node's own path: the same request, sent once
while the fast path serves and once while it is suspended (every call then
goes to the node's handlers), must get the same bytes back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core import wire
from recstore.ps.serve.native_server import NativeServer
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, spec

RNG = np.random.default_rng(11)


def native(node: ServerHandle) -> NativeServer:
    server = node.server.native_server
    assert server is not None
    return server


def raw(client: Client, method: str) -> Any:
    return client.channel.unary_unary(method)


def epoch_of(client: Client, table: str) -> int:
    stats = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table=table))
    return int(stats.slot_map.epoch)


@pytest.fixture
def filled(node: ServerHandle, client: Client) -> Iterator[dict[str, np.ndarray]]:
    """Two tables with known rows: dense float32 dim 8, hashed float16 dim 4."""
    client.create(spec("dense"))
    client.create(spec("hashed", embedding_dim=4, dtype="float16",
                       keys={"mode": "hashed", "capacity": 4096}))  # fmt: skip
    rows = {"dense": RNG.standard_normal((1000, 8)).astype("<f4"),
            "hashed": RNG.standard_normal((300, 4)).astype("<f2")}  # fmt: skip
    client.push("dense", np.arange(1000), rows["dense"])
    client.push("hashed", np.arange(300) * 7919, rows["hashed"])
    yield rows


def test_pulls_are_answered_natively_byte_for_byte_as_the_node_answers_them(
    node: ServerHandle, client: Client, filled: dict[str, np.ndarray]
) -> None:
    server = native(node)
    dense, hashed = epoch_of(client, "dense"), epoch_of(client, "hashed")
    keys = RNG.choice(1000, 64, replace=False).astype("<i8")
    multi = wire.encode_multi_pull_request([
        wire.PullRequest("dense", dense, keys),
        wire.PullRequest("hashed", hashed, (np.arange(40) * 7919).astype("<i8")),
        wire.PullRequest("dense", dense, keys[:3], value_dtype="bfloat16"),
        wire.PullRequest("hashed", hashed, np.array([5, 6], "<i8")),  # new rows: inserted
    ])  # fmt: skip
    single = wire.encode_pull_request("dense", keys, epoch=dense)
    before = server.served_natively
    fast = [raw(client, wire.MULTI_PULL)(multi), raw(client, wire.PULL)(single)]
    assert server.served_natively == before + 2
    server.suspend_fast_path()
    try:
        slow = [raw(client, wire.MULTI_PULL)(multi), raw(client, wire.PULL)(single)]
    finally:
        server.publish()
    assert server.served_natively == before + 2
    assert fast == slow
    items = wire.decode_multi_pull_response(fast[0])
    np.testing.assert_array_equal(wire.rows_view(items[0].values, 64, 8, "float32"),
                                  filled["dense"][keys])  # fmt: skip
    np.testing.assert_array_equal(wire.rows_view(items[1].values, 40, 4, "float16"),
                                  filled["hashed"][:40])  # fmt: skip


def test_the_version_a_native_pull_reports_moves_with_every_write(
    node: ServerHandle, client: Client, filled: dict[str, np.ndarray]
) -> None:
    server = native(node)
    request = wire.encode_pull_request("dense", np.arange(4, dtype="<i8"))
    versions = []
    for step in range(3):
        versions.append(wire.decode_pull_response(raw(client, wire.PULL)(request)).version)
        client.update("dense", np.arange(4), np.ones((4, 8), "<f4"), lr=0.5)
        values = client.pull("dense", np.arange(4))
        np.testing.assert_allclose(values, filled["dense"][:4] - 0.5 * (step + 1), rtol=1e-6)
    assert versions == sorted(set(versions))
    assert server.served_natively >= 6


def test_a_dropped_table_is_never_answered_natively(
    node: ServerHandle, client: Client, filled: dict[str, np.ndarray]
) -> None:
    server = native(node)
    request = wire.encode_multi_pull_request(
        [wire.PullRequest("dense", 0, np.arange(3, dtype="<i8"))]
    )
    raw(client, wire.MULTI_PULL)(request)
    served = server.served_natively
    client.call("DropTable", ps_pb2.DropTableRequest(table="dense"))
    with pytest.raises(grpc.RpcError) as info:
        raw(client, wire.MULTI_PULL)(request)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    client.create(spec("dense"))  # hosted again: fresh rows, answered natively again
    reply = wire.decode_multi_pull_response(raw(client, wire.MULTI_PULL)(request))
    fresh = wire.rows_view(reply[0].values, 3, 8, "float32")
    assert not np.any(np.isclose(fresh, filled["dense"][:3]))
    assert server.served_natively == served + 1


def test_a_table_that_records_its_pulled_keys_is_answered_by_the_node(
    node: ServerHandle, client: Client
) -> None:
    """An evicting table saved incrementally notes the rows pulls insert: not natively."""
    client.create(spec("noted", keys={"mode": "hashed", "capacity": 64, "eviction": "lru"},
                       checkpoint={"full_every": 4}))  # fmt: skip
    server = native(node)
    served = server.served_natively
    raw(client, wire.PULL)(wire.encode_pull_request("noted", np.array([3, 4], "<i8")))
    assert server.served_natively == served
    changes = node.server.node.tables["noted"].changes
    assert changes is not None and changes.pending == 2


def test_natively_answered_calls_are_in_the_metrics(
    node: ServerHandle, client: Client, filled: dict[str, np.ndarray]
) -> None:
    registry = node.server.metrics.registry

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    calls = sample("recstore_ps_requests_total", method="MultiPull", code="OK")
    rows = sample("recstore_ps_rows_total", method="MultiPull", table="dense")
    timed = sample("recstore_ps_request_seconds_count", method="MultiPull")
    request = wire.encode_multi_pull_request(
        [wire.PullRequest("dense", 0, np.arange(5, dtype="<i8"))]
    )
    served = native(node).served_natively
    for _ in range(3):
        raw(client, wire.MULTI_PULL)(request)
    assert native(node).served_natively == served + 3
    assert sample("recstore_ps_requests_total", method="MultiPull", code="OK") == calls + 3
    assert sample("recstore_ps_rows_total", method="MultiPull", table="dense") == rows + 15
    assert sample("recstore_ps_request_seconds_count", method="MultiPull") == timed + 3


def test_64_concurrent_clients_get_exact_replies(
    node: ServerHandle, filled: dict[str, np.ndarray]
) -> None:
    def work(index: int) -> int:
        client = Client(node.address)
        try:
            rng = np.random.default_rng(index)
            for _ in range(20):
                keys = rng.choice(1000, 32, replace=False)
                np.testing.assert_array_equal(client.pull("dense", keys), filled["dense"][keys])
                multi = wire.encode_multi_pull_request(
                    [wire.PullRequest("dense", 0, keys.astype("<i8"))]
                )
                reply = wire.decode_multi_pull_response(raw(client, wire.MULTI_PULL)(multi))
                np.testing.assert_array_equal(
                    wire.rows_view(reply[0].values, 32, 8, "float32"), filled["dense"][keys]
                )
            return 40
        finally:
            client.close()

    with ThreadPoolExecutor(64) as pool:
        assert sum(pool.map(work, range(64))) == 64 * 40


def test_control_calls_while_data_calls_run(
    node: ServerHandle, client: Client, filled: dict[str, np.ndarray]
) -> None:
    """Tables come and go while pulls of another run: every pull is exact, none fails."""
    stop = threading.Event()
    pulled = [0]

    def pull_until_stopped() -> None:
        puller = Client(node.address)
        try:
            keys = np.arange(100)
            while not stop.is_set() or pulled[0] < 50:
                np.testing.assert_array_equal(puller.pull("dense", keys), filled["dense"][:100])
                pulled[0] += 1
        finally:
            puller.close()

    with ThreadPoolExecutor(2) as pool:
        pulls = [pool.submit(pull_until_stopped) for _ in range(2)]
        for round_ in range(10):
            client.create(spec(f"other{round_}"))
            client.push(f"other{round_}", np.arange(3), np.full((3, 8), round_, "<f4"))
            np.testing.assert_array_equal(client.pull(f"other{round_}", np.arange(3)),
                                          np.full((3, 8), round_, "<f4"))  # fmt: skip
            client.call("DropTable", ps_pb2.DropTableRequest(table=f"other{round_}"))
        stop.set()
        for future in pulls:
            future.result()


def test_a_client_that_leaves_mid_stream_leaves_the_node_serving(
    node: ServerHandle, client: Client, filled: dict[str, np.ndarray]
) -> None:
    request = ps_pb2.ExportRowsRequest(table="dense", max_chunk_bytes=1024)
    stream = client.stub.ExportRows(request, timeout=60)
    first = next(stream)
    assert first.table == "dense" and len(first.keys) > 0
    stream.cancel()
    # the node goes on: a whole export, then a pull, are exact
    chunks = list(client.stub.ExportRows(request, timeout=60))
    keys = np.concatenate([np.frombuffer(c.keys, "<i8") for c in chunks])
    assert sorted(keys.tolist()) == list(range(1000))
    np.testing.assert_array_equal(client.pull("dense", np.arange(10)), filled["dense"][:10])


def test_a_stop_with_writes_in_flight_loses_none_it_acknowledged(tmp_path: Path) -> None:
    node = start_in_thread(data_dir=tmp_path / "node", durability="wal")
    client = Client(node.address)
    client.create(spec("acked", num_embeddings=100_000, initializer={"kind": "zeros"}))
    acknowledged: list[int] = []
    started = threading.Event()

    def write(first: int) -> None:
        writer = Client(node.address)
        try:
            for key in range(first, first + 10_000):
                writer.update("acked", [key], np.ones((1, 8), "<f4"), lr=1.0)
                acknowledged.append(key)
                started.set()
        except grpc.RpcError as error:  # the node stopped under it: what it said is kept
            assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        finally:
            writer.close()

    with ThreadPoolExecutor(4) as pool:
        writers = [pool.submit(write, first) for first in range(0, 40_000, 10_000)]
        assert started.wait(60)
        node.stop()
        for future in writers:
            future.result()
    client.close()
    assert acknowledged
    again = start_in_thread(data_dir=tmp_path / "node", durability="wal")
    try:
        reader = Client(again.address)
        values = reader.pull("acked", np.array(sorted(acknowledged)))
        np.testing.assert_array_equal(values, -np.ones((len(acknowledged), 8), "<f4"))
        reader.close()
    finally:
        again.stop(final_checkpoint=False)
