"""Tables saved incrementally stay on the native multi-table path, with the node's changes.

Two nodes get the same MultiUpdate and MultiPull requests, one served by the
engine itself, one by the node's path (``native_path.APPLY_NATIVELY`` off):
their change trackers, their checkpoints (full and incremental: rows, bytes,
every chunk, the deletions) and the rows a restart restores must be the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recstore.core import wire
from recstore.ps import multi, native_path
from recstore.ps.checkpoint import incremental, persistence
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.node import Node
from recstore.v1 import ps_pb2

from .test_incremental_checkpoints import (
    DIM,
    KINDS,
    assert_same,
    live,
    restart,
    snapshot,
    table_spec,
)


def requests(kind: str, seed: int) -> Iterator[tuple[str, bytes]]:
    """MultiUpdates of two items and MultiPulls carrying an update, keys repeated."""
    rng = np.random.default_rng(seed)
    space = KINDS[kind][1]

    def keys(n: int) -> np.ndarray:
        return rng.integers(0, space, n).astype(np.int64)

    def update(n: int) -> wire.UpdateRequest:
        k = keys(n)
        grads = rng.standard_normal((len(k), DIM)).astype(np.float32)
        return wire.UpdateRequest("emb", 0, k, grads, "float32", None, DIM)

    while True:
        yield "MultiUpdate", wire.encode_multi_update_request([update(40), update(25)])
        pull = wire.PullRequest("emb", 0, keys(30))
        yield "MultiPull", wire.encode_multi_pull_request([pull], [update(20)])


def without_versions(method: str, reply: bytes, node: Node) -> bytes:
    """The reply with its pulls' table versions checked and cleared.

    Versions come from one sequence per process, so two nodes never report the same
    one: each pull must report a version of its own node's table (read before the
    carried updates, so at most the current one), the rest must be equal bytes.
    """
    if method != "MultiPull":
        return reply
    message = ps_pb2.MultiPullResponse.FromString(reply)
    for item in message.items:
        assert 0 < item.version <= node.get("emb").version
        item.version = 0
    return message.SerializeToString()


class Paths:
    """The two nodes, and which of them reached the node's own path."""

    def __init__(self, tmp_path: Path, kind: str, optimizer: str) -> None:
        self.nodes = {"native": Node(tmp_path / "native"), "node": Node(tmp_path / "node")}
        for node in self.nodes.values():
            node.create_table(table_spec(kind, optimizer), None)
        self.applied_by_node: dict[str, int] = {"native": 0, "node": 0}

    def serve(self, monkeypatch: pytest.MonkeyPatch, method: str, request: bytes) -> None:
        replies = []
        for name, node in self.nodes.items():
            monkeypatch.setattr(native_path, "APPLY_NATIVELY", name == "native")
            replies.append(
                without_versions(method, native_path.serve(node, method, request).reply, node)
            )
        assert replies[0] == replies[1]

    def count(self, monkeypatch: pytest.MonkeyPatch) -> None:
        applied = multi.apply_checked

        def counted(node: Node, *args: Any, **kwargs: Any) -> Any:
            self.applied_by_node["native" if node is self.nodes["native"] else "node"] += 1
            return applied(node, *args, **kwargs)

        monkeypatch.setattr(multi, "apply_checked", counted)


def chunks(info: Any) -> list[np.ndarray]:
    return [
        np.asarray(a).copy() for chunk in checkpoint_read.table_chunks(info, "emb") for a in chunk
    ]


@pytest.mark.parametrize(
    ("kind", "optimizer"),
    [("dense", "adagrad"), ("hashed", "adam"), ("evicting", "rowwise_adagrad")],
)
def test_both_paths_track_and_save_the_same_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, optimizer: str
) -> None:
    paths = Paths(tmp_path, kind, optimizer)
    paths.count(monkeypatch)
    sent = requests(kind, seed=11)
    saved_kinds = []
    for _ in range(5):
        for _ in range(6):
            paths.serve(monkeypatch, *next(sent))
        trackers = [n.tables["emb"].changes for n in paths.nodes.values()]
        assert trackers[0] is not None and trackers[1] is not None
        assert trackers[0].pending == trackers[1].pending > 0
        native, node = (persistence.save(n, keep=10) for n in paths.nodes.values())
        saved_kinds.append(incremental.kind_of(native, "emb"))
        assert incremental.kind_of(node, "emb") == saved_kinds[-1]
        assert (native.rows, native.bytes) == (node.rows, node.bytes)
        for a, b in zip(chunks(native), chunks(node), strict=True):
            np.testing.assert_array_equal(a, b)
        files = [i.manifest["tables"]["emb"]["files"] for i in (native, node)]
        assert files[0] == files[1]  # the deletions and every file's size and digest
    assert saved_kinds == ["full", "incremental", "incremental", "incremental", "full"]
    assert paths.applied_by_node == {"native": 0, "node": 30}  # the engine served them all
    for node in paths.nodes.values():
        want = snapshot(live(node))
        assert_same(snapshot(live(restart(node))), want)


class _FailingAfterOne:
    """A parsed request whose engine applied its first update, then failed."""

    def __init__(self, request: bytes, first_keys: np.ndarray) -> None:
        parsed = native_path._native.MultiRequest("MultiUpdate", request)
        self.tables, self.update_tables = parsed.tables, parsed.update_tables
        self.keys_at = request.index(first_keys.tobytes())
        self.rows = len(first_keys)

    def serve(self, views: Any, natively: bool, reply_limit: int) -> tuple[Any, ...]:
        return ("failed", "engine said no", False, [(0, self.rows, self.keys_at)], 2)


def test_the_updates_applied_before_an_engine_failure_are_tracked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path / "node")
    node.create_table(table_spec("hashed", "sgd"), None)
    first, second = np.array([5, 9, 5], np.int64), np.array([70, 71], np.int64)
    request = wire.encode_multi_update_request(
        wire.UpdateRequest("emb", 0, k, np.ones((len(k), DIM), np.float32), "", None, DIM)
        for k in (first, second)
    )
    failing = _FailingAfterOne(request, first)
    monkeypatch.setattr(native_path, "parse", lambda method, request: failing)
    with pytest.raises(Exception, match="engine said no"):
        native_path.serve(node, "MultiUpdate", request)
    changes = node.tables["emb"].changes
    assert changes is not None and changes.pending == 3
    np.testing.assert_array_equal(changes.drain(), [5, 9])
