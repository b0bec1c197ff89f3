"""Exactly-once updates end to end: lost replies, resends, restarts, reused ids.

Each update adds unique integer deltas through SGD with lr 1 to rows that start
at zero, so a row tells exactly how many times each update was applied.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from recstore.client.remote.backend import GrpcBackend
from recstore.core import slot_of, wire
from recstore.core.request_id import RequestId, with_request_id
from recstore.ps import multi, native_path
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.ps.wal import dedup
from recstore.ps.wal.segment_file import SegmentFile

from .conftest import Client, spec
from .drop_proxy import DropProxy

DIM = 4


def table(name: str = "emb", rows: int = 10_000):
    return spec(
        name, num_embeddings=rows, embedding_dim=DIM,
        optimizer={"kind": "sgd", "lr": 1.0}, initializer={"kind": "zeros"},
    )  # fmt: skip


def deltas(count: int, start: int = 1) -> np.ndarray:
    """Unique integer gradients, one row per key."""
    return np.arange(start, start + count * DIM, dtype=np.float32).reshape(count, DIM)


@pytest.fixture
def proxy(node: ServerHandle) -> Iterator[DropProxy]:
    p = DropProxy(node.address)
    yield p
    p.close()


def backend_to(address: str, timeout: float = 30.0) -> GrpcBackend:
    return GrpcBackend(endpoints=(address,), rpc_timeout=timeout)


def resent(backend: GrpcBackend) -> int:
    return sum(n.resent for n in backend._nodes.values())


def window(handle: ServerHandle, name: str = "emb") -> dedup.DedupWindow:
    return handle.server.node.tables[name].window


def test_update_whose_reply_is_lost_is_resent_and_applied_once(
    node: ServerHandle, proxy: DropProxy
) -> None:
    backend = backend_to(proxy.address)
    try:
        backend.create_table(table())
        keys = torch.arange(0, 50)
        grads = torch.from_numpy(deltas(50))
        proxy.drop_replies(1)
        backend.update("emb", keys, grads, lr=1.0)  # the reply is lost, the resend answered
        assert proxy.dropped == 1 and resent(backend) >= 1
        torch.testing.assert_close(backend.pull("emb", keys), -grads, rtol=0, atol=0)
        assert len(window(node)) == 1
    finally:
        backend.close()


def test_multi_update_whose_reply_is_lost_is_applied_once(
    node: ServerHandle, proxy: DropProxy
) -> None:
    backend = backend_to(proxy.address)
    try:
        for name in ("a", "b"):
            backend.create_table(table(name))
        keys = torch.arange(10, 30)
        grads_a, grads_b = torch.from_numpy(deltas(20)), torch.from_numpy(deltas(20, 1000))
        proxy.drop_replies(1)
        backend.update_many([("a", keys, grads_a, 1.0), ("b", keys, grads_b, 1.0)])
        assert proxy.dropped == 1 and resent(backend) >= 1
        torch.testing.assert_close(backend.pull("a", keys), -grads_a, rtol=0, atol=0)
        torch.testing.assert_close(backend.pull("b", keys), -grads_b, rtol=0, atol=0)
    finally:
        backend.close()


def _raw(address: str, method: str) -> tuple[grpc.Channel, grpc.UnaryUnaryMultiCallable]:
    channel = grpc.insecure_channel(address)
    return channel, channel.unary_unary(getattr(wire, {
        "Update": "UPDATE", "MultiPull": "MULTI_PULL", "MultiUpdate": "MULTI_UPDATE",
    }[method]))  # fmt: skip


def _pull(address: str, keys: np.ndarray) -> np.ndarray:
    backend = backend_to(address)
    try:
        return backend.pull("emb", torch.from_numpy(keys)).numpy()
    finally:
        backend.close()


def _named_update(keys: np.ndarray, grads: np.ndarray, seq: int = 1) -> bytes:
    body = wire.encode_update_request("emb", keys, grads, dim=DIM)
    return with_request_id("Update", body, RequestId("trainer", seq))


def test_multi_pull_resend_applies_its_carried_updates_once_and_pulls_again(
    node: ServerHandle,
) -> None:
    backend = backend_to(node.address)
    backend.create_table(table())
    backend.close()
    keys = np.arange(5, dtype="<i8")
    grads = deltas(5)
    update = wire.UpdateRequest("emb", 0, keys.data, grads.data, "float32", 1.0, DIM)
    pull = wire.PullRequest("emb", 0, keys.data)
    body = wire.encode_multi_pull_request([pull], [update])
    request = with_request_id("MultiPull", body, RequestId("trainer", 7))
    channel, call = _raw(node.address, "MultiPull")
    try:
        first = wire.decode_multi_pull_reply(call(request, timeout=30))
        again = wire.decode_multi_pull_reply(call(request, timeout=30))
    finally:
        channel.close()
    for replies, carried in (first, again):
        assert carried == [5]
        np.testing.assert_array_equal(wire.rows_view(replies[0].values, 5, DIM, "float32"), -grads)
    np.testing.assert_array_equal(_pull(node.address, keys), -grads)


class HeldDisk:
    """Segment files whose next write waits until released (an apply in progress)."""

    def __init__(self) -> None:
        self.armed = False
        self.writing = threading.Event()
        self.release = threading.Event()

    def __call__(self, path: Path) -> SegmentFile:
        disk = self

        class Held(SegmentFile):
            def write(self, data: bytes | memoryview) -> None:
                if disk.armed:
                    disk.armed = False
                    disk.writing.set()
                    disk.release.wait(60)
                super().write(data)

        return Held(path)


def test_resend_while_the_first_send_is_applied_waits_for_its_outcome(tmp_path: Path) -> None:
    disk = HeldDisk()
    handle = start_in_thread(data_dir=tmp_path / "node", durability="wal", wal_files=disk)
    backend = backend_to(handle.address, timeout=1.0)  # the held send passes its deadline
    try:
        backend.create_table(table())
        count = 3000  # past the inline bound: both sends run on the node's pool
        keys, grads = torch.arange(count), torch.from_numpy(deltas(count))
        disk.armed = True
        failures: list[BaseException] = []

        def send() -> None:
            try:
                backend.update("emb", keys, grads, lr=1.0)
            except BaseException as error:
                failures.append(error)

        sender = threading.Thread(target=send)
        sender.start()
        assert disk.writing.wait(30)  # the first send is being applied
        assert window(handle).wait_for_waiters(1, timeout=30)  # its resend waits for it
        disk.release.set()
        sender.join(60)
        assert failures == [] and resent(backend) >= 1
        slow = backend_to(handle.address)
        try:
            torch.testing.assert_close(slow.pull("emb", keys), -grads, rtol=0, atol=0)
        finally:
            slow.close()
    finally:
        disk.release.set()
        backend.close()
        handle.stop(final_checkpoint=False)


@pytest.mark.parametrize("checkpoint_between", [False, True])
def test_resend_after_a_wal_restart_is_still_deduplicated(
    tmp_path: Path, checkpoint_between: bool
) -> None:
    data_dir = tmp_path / "node"
    keys, grads = np.arange(8, dtype="<i8"), deltas(8)
    request = _named_update(keys, grads)
    handle = start_in_thread(data_dir=data_dir, durability="wal")
    try:
        backend = backend_to(handle.address)
        backend.create_table(table())
        backend.close()
        channel, call = _raw(handle.address, "Update")
        assert wire.decode_rows_response(call(request, timeout=30)) == 8
        channel.close()
        if checkpoint_between:  # the log is replayed from after this update
            control = Client(handle.address)
            control.save()
            control.close()
    finally:
        handle.stop(final_checkpoint=False)
    handle = start_in_thread(data_dir=data_dir, durability="wal")
    try:
        channel, call = _raw(handle.address, "Update")
        assert wire.decode_rows_response(call(request, timeout=30)) == 8  # answered
        channel.close()
        np.testing.assert_array_equal(_pull(handle.address, keys), -grads)
    finally:
        handle.stop(final_checkpoint=False)


def test_reused_id_with_other_content_is_refused_and_changes_nothing(node: ServerHandle) -> None:
    backend = backend_to(node.address)
    backend.create_table(table())
    backend.close()
    keys = np.arange(3, dtype="<i8")
    channel, call = _raw(node.address, "Update")
    try:
        call(_named_update(keys, deltas(3)), timeout=30)
        with pytest.raises(grpc.RpcError) as refused:
            call(_named_update(keys, deltas(3, 500)), timeout=30)
    finally:
        channel.close()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "other content" in refused.value.details()
    np.testing.assert_array_equal(_pull(node.address, keys), -deltas(3))


def test_a_resend_older_than_the_window_is_refused_not_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(dedup.WINDOW_ENV, "2")
    handle = start_in_thread(data_dir=tmp_path / "node")
    try:
        backend = backend_to(handle.address)
        backend.create_table(table())
        backend.close()
        keys = np.arange(2, dtype="<i8")
        channel, call = _raw(handle.address, "Update")
        try:
            for seq in (1, 2, 3):
                call(_named_update(keys, deltas(2, 10 * seq), seq), timeout=30)
            assert len(window(handle)) == 2
            with pytest.raises(grpc.RpcError) as refused:
                call(_named_update(keys, deltas(2, 10), 1), timeout=30)
        finally:
            channel.close()
        assert refused.value.code() == grpc.StatusCode.ABORTED
        expected = -(deltas(2, 10) + deltas(2, 20) + deltas(2, 30))
        np.testing.assert_array_equal(_pull(handle.address, keys), expected)
    finally:
        handle.stop(final_checkpoint=False)


def test_entries_moved_with_their_slots_survive_a_restart_of_the_target(tmp_path: Path) -> None:
    """Online resharding hands the source's entries of the moving slots to the target."""
    keys, grads = np.arange(6, dtype="<i8"), deltas(6)
    request = _named_update(keys, grads, seq=9)
    source = start_in_thread(data_dir=tmp_path / "source")
    target_dir = tmp_path / "target"
    target = start_in_thread(data_dir=target_dir, durability="wal")
    try:
        for handle in (source, target):
            backend = backend_to(handle.address)
            backend.create_table(table())
            backend.close()
        channel, call = _raw(source.address, "Update")
        call(request, timeout=30)
        channel.close()
        moving = np.zeros(16384, bool)
        moving[slot_of(keys)] = True
        entries = window(source).entries_touching(moving)
        assert [e.request_id.seq for e in entries] == [9]
        target.server.node.absorb_window("emb", entries)
    finally:
        source.stop(final_checkpoint=False)
        target.stop(final_checkpoint=False)
    target = start_in_thread(data_dir=target_dir, durability="wal")
    try:
        channel, call = _raw(target.address, "Update")
        assert wire.decode_rows_response(call(request, timeout=30)) == 6  # answered
        channel.close()
        np.testing.assert_array_equal(_pull(target.address, keys), np.zeros((6, DIM)))
    finally:
        target.stop(final_checkpoint=False)


def test_resend_after_pulls_failed_behind_applied_updates_does_not_apply_them_again(
    node: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = backend_to(node.address)
    backend.create_table(table())
    backend.close()
    keys, grads = np.arange(4, dtype="<i8"), deltas(4)
    update = wire.UpdateRequest("emb", 0, keys.data, grads.data, "float32", 1.0, DIM)
    body = wire.encode_multi_pull_request([wire.PullRequest("emb", 0, keys.data)], [update])
    request = with_request_id("MultiPull", body, RequestId("trainer", 3))
    monkeypatch.setattr(native_path, "APPLY_NATIVELY", False)
    failing = pytest.MonkeyPatch()
    failing.setattr(multi, "pull_items", _engine_fails)
    channel, call = _raw(node.address, "MultiPull")
    try:
        with pytest.raises(grpc.RpcError) as aborted:
            call(request, timeout=30)
        assert aborted.value.code() == grpc.StatusCode.ABORTED
        failing.undo()
        replies, carried = wire.decode_multi_pull_reply(call(request, timeout=30))
    finally:
        failing.undo()
        channel.close()
    assert carried == [4]
    np.testing.assert_array_equal(wire.rows_view(replies[0].values, 4, DIM, "float32"), -grads)


def _engine_fails(items: object, outs: object) -> None:
    raise RuntimeError("engine failure while pulling")
