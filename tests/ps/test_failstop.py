"""Fail-stop in WAL mode: a write is applied only once logged, and a log failure stops writes.

The node's log files come from a ``FailingDisk`` (its ``wal_files`` seam), so
each test makes writes or fsyncs fail the way a full or broken disk does and
checks what clients see (status, ``x-recstore-applied``), what the node holds,
its health and metrics, the resume once the disk works again, and what a
restart recovers: exactly the acknowledged writes.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from recstore.client import WriteAppliedNotDurable, WriteNotApplied
from recstore.client.remote.nodes import NodeCalls
from recstore.core import wire
from recstore.core.wire import WireClient
from recstore.ps import native_path
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, MountTmpfs, spec
from .wal_faults import FailingDisk

TABLES = [
    spec(name, embedding_dim=4, optimizer={"kind": "sgd", "lr": 1.0}, initializer={"kind": "zeros"})
    for name in ("a", "b")
]
KEYS = np.array([1, 2, 3], dtype=np.int64)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def rows(value: float) -> np.ndarray:
    return np.full((len(KEYS), 4), value, np.float32)


def wait_health(channel: grpc.Channel, wanted: int, service: str = "") -> None:
    """Wait (on the health Watch stream) until the node reports ``wanted``."""
    stub = health_pb2_grpc.HealthStub(channel)
    for reply in stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=30):
        if reply.status == wanted:
            return


class Node:
    """A WAL-mode node on a failing disk, restartable on the same data dir."""

    def __init__(self, data_dir: Path, disk: FailingDisk) -> None:
        self.data_dir, self.disk = data_dir, disk
        self.handle: ServerHandle | None = None
        self.channel: grpc.Channel | None = None
        self.start()

    def start(self) -> None:
        self.handle = start_in_thread(
            data_dir=self.data_dir, durability="wal", table_specs=TABLES,
            wal_files=self.disk, wal_probe_interval=0.01,
        )  # fmt: skip
        self.channel = grpc.insecure_channel(self.handle.address)
        self.wire = WireClient(self.channel, timeout=30)

    def restart(self) -> None:
        """A crash-like restart (no final checkpoint) on a disk that works again."""
        assert self.handle is not None and self.channel is not None
        self.channel.close()
        self.handle.stop(final_checkpoint=False)
        self.disk.heal()  # only now: the stopped node cannot resume before the restart
        self.start()

    def stop(self) -> None:
        if self.handle is not None and self.channel is not None:
            self.channel.close()
            self.handle.stop(final_checkpoint=False)
            self.handle = None

    def pull(self, table: str = "a") -> np.ndarray:
        values, _ = self.wire.pull(table, KEYS)
        return np.asarray(values)

    def health(self, wanted: int) -> None:
        assert self.channel is not None
        wait_health(self.channel, wanted)

    def metrics(self) -> str:
        assert self.handle is not None
        return generate_latest(self.handle.server.metrics.registry).decode()


@pytest.fixture
def disk() -> FailingDisk:
    return FailingDisk()


@pytest.fixture
def node(tmp_path: Path, disk: FailingDisk) -> Iterator[Node]:
    started = Node(tmp_path / "node", disk)
    yield started
    disk.heal()
    started.stop()


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    return failure.value


def applied(error: grpc.RpcError) -> str | None:
    return dict(error.trailing_metadata() or ()).get("x-recstore-applied")  # type: ignore[attr-defined]


WRITES: dict[str, Callable[[Node, float], object]] = {
    "Push": lambda n, v: n.wire.push("a", KEYS, rows(v)),
    "Update": lambda n, v: n.wire.update("a", KEYS, rows(-v)),  # sgd, lr 1: adds v
    "MultiUpdate": lambda n, v: n.wire.multi_update([("a", KEYS, rows(-v)), ("b", KEYS, rows(-v))]),
}


@pytest.fixture(params=["native path", "python path"])
def multi_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param == "python path":
        monkeypatch.setattr(native_path, "APPLY_NATIVELY", False)


@pytest.mark.usefixtures("multi_path")
@pytest.mark.parametrize("method", sorted(WRITES))
def test_a_write_the_log_cannot_take_is_refused_with_nothing_applied(
    node: Node, disk: FailingDisk, method: str
) -> None:
    write = WRITES[method]
    write(node, 1.0)  # acknowledged: durable
    disk.fail_writes(errno.ENOSPC, torn=True)
    error = refused(lambda: write(node, 5.0))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert applied(error) == "false"
    assert "No space left on device" in error.details() and "nothing" in error.details()
    np.testing.assert_array_equal(node.pull("a"), rows(1.0))  # nothing applied, reads go on
    node.health(NOT_SERVING)
    later = refused(lambda: node.wire.push("b", KEYS, rows(7.0)))  # every table stops
    assert later.code() == grpc.StatusCode.UNAVAILABLE and applied(later) == "false"
    assert "writes stopped" in later.details() and "[ENOSPC]" in later.details()
    text = node.metrics()
    assert "recstore_ps_writes_stopped 1.0" in text
    assert 'recstore_ps_wal_faults_total{operation="write"} 1.0' in text
    assert 'operation="write"' in text and 'errno="ENOSPC"' in text
    node.restart()  # recovery from checkpoint and log: exactly the acknowledged writes
    np.testing.assert_array_equal(node.pull("a"), rows(1.0))
    node.health(SERVING)
    write(node, 2.0)
    node.restart()
    np.testing.assert_array_equal(node.pull("a"), rows(2.0) if method == "Push" else rows(3.0))


def test_writes_resume_once_the_disk_works_again(node: Node, disk: FailingDisk) -> None:
    node.wire.push("a", KEYS, rows(1.0))
    disk.fail_writes(errno.ENOSPC)
    refused(lambda: node.wire.push("a", KEYS, rows(2.0)))
    node.health(NOT_SERVING)
    assert node.channel is not None
    wait_health(node.channel, NOT_SERVING, "recstore.v1.ParameterServer")
    wait_health(node.channel, SERVING, "liveness")  # alive: reads go on, no restart wanted
    refused(lambda: node.wire.update("a", KEYS, rows(-1.0)))  # the probe keeps failing
    assert node.handle is not None
    admin = Client(node.handle.address)
    load = refused(lambda: admin.call("Load", ps_pb2.LoadRequest()))  # it replaces tables
    assert load.code() == grpc.StatusCode.UNAVAILABLE and applied(load) == "false"
    admin.close()
    disk.heal()
    node.health(SERVING)
    assert "recstore_ps_writes_stopped 0.0" in node.metrics()
    assert "recstore_ps_wal_fault_since_timestamp_seconds{" not in node.metrics()
    node.wire.update("a", KEYS, rows(-1.0))
    np.testing.assert_array_equal(node.pull("a"), rows(2.0))
    node.restart()
    np.testing.assert_array_equal(node.pull("a"), rows(2.0))


def test_a_multi_update_whose_second_table_cannot_log_applies_neither(
    node: Node, disk: FailingDisk
) -> None:
    disk.fail_writes(errno.ENOSPC, where=lambda path: path.parent.name.startswith("b-"))
    error = refused(
        lambda: node.wire.multi_update([("a", KEYS, rows(-1.0)), ("b", KEYS, rows(-1.0))])
    )
    assert error.code() == grpc.StatusCode.UNAVAILABLE and applied(error) == "false"
    np.testing.assert_array_equal(node.pull("a"), rows(0.0))
    np.testing.assert_array_equal(node.pull("b"), rows(0.0))
    node.restart()  # table a's record was cut back out of its log: it does not come back
    np.testing.assert_array_equal(node.pull("a"), rows(0.0))


def test_a_failed_fsync_answers_applied_and_a_restart_keeps_only_acknowledged_writes(
    node: Node, disk: FailingDisk
) -> None:
    node.wire.update("a", KEYS, rows(-1.0))
    disk.fail_syncs(errno.EIO)
    error = refused(lambda: node.wire.update("a", KEYS, rows(-10.0)))
    assert error.code() == grpc.StatusCode.DATA_LOSS and applied(error) == "true"
    assert "Input/output error" in error.details() and "do not resend" in error.details()
    np.testing.assert_array_equal(node.pull("a"), rows(11.0))  # applied in memory
    node.health(NOT_SERVING)
    later = refused(lambda: node.wire.update("a", KEYS, rows(-100.0)))
    assert later.code() == grpc.StatusCode.UNAVAILABLE and applied(later) == "false"
    node.restart()  # before the node resumed: the write that was not durable is gone
    np.testing.assert_array_equal(node.pull("a"), rows(1.0))


def test_resuming_after_a_failed_fsync_checkpoints_what_memory_holds(
    node: Node, disk: FailingDisk
) -> None:
    node.wire.update("a", KEYS, rows(-1.0))
    disk.fail_syncs(errno.EIO)
    refused(lambda: node.wire.update("a", KEYS, rows(-10.0)))
    node.health(NOT_SERVING)
    checkpoints = node.data_dir / "checkpoints"
    assert not checkpoints.exists() or not any(checkpoints.iterdir())
    disk.heal()
    node.health(SERVING)
    assert any(checkpoints.iterdir())  # the resume made memory durable first
    node.wire.update("a", KEYS, rows(-100.0))
    node.restart()
    np.testing.assert_array_equal(node.pull("a"), rows(111.0))  # what the node served


def test_the_sdk_tells_a_refused_write_from_an_applied_one(node: Node, disk: FailingDisk) -> None:
    assert node.handle is not None
    with ThreadPoolExecutor(1) as senders:
        calls = NodeCalls(node.handle.address, (), 30.0, senders)
        request = wire.encode_update_request("a", KEYS, rows(-1.0))
        disk.fail_syncs(errno.EIO)
        with pytest.raises(WriteAppliedNotDurable, match="DATA_LOSS") as applied_error:
            calls.start("Update", request, "a", blocking=True)()
        with pytest.raises(WriteNotApplied, match="UNAVAILABLE") as refused_error:
            calls.start("Update", request, "a", blocking=True)()
        calls.close()
    assert applied_error.value.applied and not refused_error.value.applied
    np.testing.assert_array_equal(node.pull("a"), rows(1.0))  # the first one only


def test_a_write_the_engine_refuses_leaves_no_record_behind(node: Node) -> None:
    assert node.handle is not None
    admin = Client(node.handle.address)
    admin.create(spec("full", embedding_dim=4, keys={"mode": "hashed", "capacity": 2}))
    admin.close()
    error = refused(lambda: node.wire.push("full", KEYS, rows(1.0)))  # 3 keys, room for 2
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    node.wire.push("full", KEYS[:2], rows(2.0)[:2])
    node.restart()  # the refused push's record was cut back out: replay does not meet it
    values, found = node.wire.pull("full", KEYS, read_only=True)
    assert list(np.asarray(found)) == [True, True, False]
    np.testing.assert_array_equal(np.asarray(values)[:2], rows(2.0)[:2])


def test_a_full_filesystem_stops_writes_until_space_is_freed(
    tmp_path: Path, mounts: MountTmpfs
) -> None:
    """A real 1 MiB tmpfs as the data dir: no fault injection, the kernel says ENOSPC."""
    data_dir = tmp_path / "node"
    mounts(data_dir, "size=1m")
    table = spec("big", num_embeddings=1 << 16, embedding_dim=64, initializer={"kind": "zeros"})
    batch = 256  # ~66 KiB per record

    def keys_of(i: int) -> np.ndarray:
        return np.arange(i * batch, (i + 1) * batch, dtype=np.int64)

    def start() -> tuple[ServerHandle, grpc.Channel, WireClient]:
        handle = start_in_thread(
            data_dir=data_dir, durability="wal", table_specs=[table], wal_probe_interval=0.01
        )
        channel = grpc.insecure_channel(handle.address)
        return handle, channel, WireClient(channel, timeout=30)

    def pulled(client: WireClient, i: int) -> np.ndarray:
        return np.asarray(client.pull("big", keys_of(i))[0])

    filler = data_dir / "filler"
    with filler.open("wb") as out, pytest.raises(OSError, match="No space left"):
        while True:  # fill the filesystem, then give back room for a few records
            out.write(b"\0" * 65536)
            out.flush()
    with filler.open("r+b") as out:
        out.truncate(max(0, filler.stat().st_size - 200 * 1024))
    handle, channel, client = start()
    try:
        acknowledged: list[int] = []
        failure: grpc.RpcError | None = None
        for i in range(32):
            try:
                client.push("big", keys_of(i), np.full((batch, 64), i + 1.0, np.float32))
            except grpc.RpcError as error:
                failure = error
                break
            acknowledged.append(i)
        assert failure is not None, "the filesystem never filled up"
        refused_batch = len(acknowledged)
        assert failure.code() == grpc.StatusCode.UNAVAILABLE, failure.details()
        assert applied(failure) == "false" and "No space left on device" in failure.details()
        np.testing.assert_array_equal(pulled(client, refused_batch), 0.0)  # nothing applied
        wait_health(channel, NOT_SERVING)
        for i in acknowledged:  # reads go on
            np.testing.assert_array_equal(pulled(client, i), i + 1.0)
        filler.unlink()  # space is freed: the probe resumes writes
        wait_health(channel, SERVING)
        client.push("big", keys_of(refused_batch), np.full((batch, 64), -1.0, np.float32))
    finally:
        channel.close()
        handle.stop(final_checkpoint=False)
    handle, channel, client = start()  # recovery: exactly the acknowledged writes
    try:
        for i in acknowledged:
            np.testing.assert_array_equal(pulled(client, i), i + 1.0)
        np.testing.assert_array_equal(pulled(client, refused_batch), -1.0)
        np.testing.assert_array_equal(pulled(client, refused_batch + 1), 0.0)
    finally:
        channel.close()
        handle.stop(final_checkpoint=False)
