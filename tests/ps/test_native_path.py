# ruff: noqa: E501  (one refused request per line reads best as a table)
"""The multi-table validator and native path: the oracle's results, the Python framing, refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core import (
    NUM_SLOTS,
    CapacityExhausted,
    DType,
    InvalidArgument,
    RecStoreError,
    SlotMap,
    slot_of,
    wire,
)
from recstore.core.grpc_status import status_of
from recstore.ps import native_path
from recstore.ps.node import Node
from recstore.store import Table
from recstore.v1 import ps_pb2

from .conftest import spec

SPECS = [
    spec("sgd", optimizer={"kind": "sgd", "lr": 0.5}),
    spec("ada", embedding_dim=4, optimizer={"kind": "adagrad", "lr": 0.1}),
    spec("adam", optimizer={"kind": "adam", "lr": 0.05}),
    spec("half", dtype="float16", optimizer={"kind": "sgd", "lr": 0.25}),
    spec("bf", dtype="bfloat16", embedding_dim=3, optimizer={"kind": "adagrad", "lr": 0.2}),
    spec("lru", keys={"mode": "hashed", "capacity": 4096, "eviction": "lru"}),
    spec("full", keys={"mode": "hashed", "capacity": 8}, initializer={"kind": "zeros"}),
]
OWNED = SlotMap.initial(2).owner_table()[slot_of(np.arange(1000))] == 0
MINE = np.arange(1000)[OWNED]
FOREIGN = np.arange(1000)[~OWNED]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    node = Node(tmp_path, shard_index=0, num_shards=2)
    for s in SPECS:
        node.create_table(s.model_copy(update={"shards": 2}), None)
    return node


@pytest.fixture
def oracle() -> dict[str, Table]:
    """Each table as the engine facade holds it, for expected results."""
    return {s.name: Table(s.model_copy(update={"shards": 2}), num_shards=2) for s in SPECS}


def _grads(name: str, keys: np.ndarray, seed: int, dtype: Any = np.float32) -> np.ndarray:
    dim = next(s.embedding_dim for s in SPECS if s.name == name)
    return np.random.default_rng(seed).standard_normal((len(keys), dim)).astype(dtype)


def _keys(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(MINE, n)  # repeats included


def _snapshot(node: Node) -> dict[str, Any]:
    return {
        name: (h.table.size, h.table.find(MINE)[0].tobytes(), h.table.find(MINE)[1].tobytes())
        for name, h in node.tables.items()
    }


def _expected_reply(
    oracle: dict[str, Table],
    pulls: list[tuple[str, np.ndarray]],
    carried_rows: list[int],
    versions: list[int],
) -> bytes:
    shapes = [
        (len(k), oracle[n].dim, DType(oracle[n].spec.dtype).value, False) for n, k in pulls
    ]  # fmt: skip
    message, outs = wire.multi_pull_response_frame(
        shapes, carried_rows=carried_rows, versions=versions
    )
    for (name, keys), (values, _) in zip(pulls, outs, strict=True):
        oracle[name].pull(keys, out=values)
    return wire.finish(message)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "generated encoding"])
def test_carried_updates_then_pulls_match_the_oracle_and_the_python_framing(
    node: Node, oracle: dict[str, Table], aligned: bool
) -> None:
    for step in range(3):
        updates = [
            ("sgd", _keys(step, 40), None, np.float32),
            ("ada", _keys(step + 10, 7), 0.3, np.float32),
            ("adam", _keys(step + 20, 12), None, np.float32),
            ("half", _keys(step + 30, 5), None, np.float16),  # grads in the table dtype
            ("bf", _keys(step + 40, 9), None, np.float32),
            ("sgd", _keys(step + 50, 3), 0.125, np.float32),  # a table twice: in order
            ("lru", np.array([], np.int64), None, np.float32),
        ]
        pulls = [
            ("adam", _keys(step + 60, 30)), ("sgd", _keys(step + 70, 50)), ("half", MINE[:4]),
            ("bf", _keys(step + 80, 6)), ("lru", _keys(step, 10)),
        ]  # fmt: skip
        items = []
        for i, (name, keys, lr, dtype) in enumerate(updates):
            grads = _grads(name, keys, step * 100 + i, dtype)
            oracle[name].update(keys, grads, lr)
            items.append((name, keys, grads, lr))
        if aligned:
            request = wire.encode_multi_pull_request(
                [wire.PullRequest(n, 0, k) for n, k in pulls],
                [
                    wire.UpdateRequest(n, 0, k, g, wire.dtype_name(g), lr, g.shape[1])
                    for n, k, g, lr in items
                ],
            )
        else:
            request = ps_pb2.MultiPullRequest(
                items=[ps_pb2.PullRequest(table=n, keys=k.tobytes()) for n, k in pulls],
                updates=[
                    ps_pb2.UpdateRequest(
                        table=n, keys=k.tobytes(), grads=g.tobytes(),
                        grad_dtype=wire.dtype_name(g), **({} if lr is None else {"lr": lr}),
                    )
                    for n, k, g, lr in items
                ],
            ).SerializeToString()  # fmt: skip
        versions = [node.tables[n].version for n, _ in pulls]  # read before the rows
        served = native_path.serve(node, "MultiPull", request)
        assert served is not None
        assert served.updated == [(n, len(k)) for n, k, _, _ in updates]
        assert served.pulled == [(n, len(k)) for n, k in pulls]
        carried = [len(k) for _, k, _, _ in updates]
        assert served.reply == _expected_reply(oracle, pulls, carried, versions)


def test_a_multi_update_matches_the_oracle(node: Node, oracle: dict[str, Table]) -> None:
    items = [("adam", _keys(1, 20)), ("ada", _keys(2, 3)), ("adam", _keys(3, 2))]
    grads = [_grads(n, k, i) for i, (n, k) in enumerate(items)]
    request = wire.encode_multi_update_request(
        wire.UpdateRequest(n, 0, k, g, "float32", None, g.shape[1])
        for (n, k), g in zip(items, grads, strict=True)
    )
    served = native_path.serve(node, "MultiUpdate", request)
    assert served is not None
    assert served.reply == wire.encode_multi_rows_response(len(k) for _, k in items)
    for (name, keys), g in zip(items, grads, strict=True):
        oracle[name].update(keys, g)
    for name in ("adam", "ada"):
        np.testing.assert_array_equal(
            node.tables[name].table.find(MINE)[0], oracle[name].find(MINE)[0]
        )


def _update(table: str, keys: Any, **fields: Any) -> ps_pb2.UpdateRequest:
    k = np.asarray(keys, "<i8")
    dim = next(s.embedding_dim for s in SPECS if s.name == table) if table in node_names() else 8
    fields.setdefault("grads", np.ones((len(k), dim), "<f4").tobytes())
    return ps_pb2.UpdateRequest(table=table, keys=k.tobytes(), **fields)


def node_names() -> set[str]:
    return {s.name for s in SPECS}


def _pull(table: str, keys: Any, **fields: Any) -> ps_pb2.PullRequest:
    return ps_pb2.PullRequest(table=table, keys=np.asarray(keys, "<i8").tobytes(), **fields)


REFUSED = [
    ("unknown table", [_pull("nope", MINE[:1])], [], "NOT_FOUND"),
    ("a foreign key", [_pull("sgd", [MINE[0], FOREIGN[0]])], [], "FAILED_PRECONDITION"),
    ("a foreign key in an update", [_pull("sgd", MINE[:2])], [_update("sgd", FOREIGN[:1])], "FAILED_PRECONDITION"),
    ("dense id out of range", [_pull("adam", [1000])], [], "INVALID_ARGUMENT"),
    ("keys not whole int64s", [ps_pb2.PullRequest(table="sgd", keys=bytes(12))], [], "INVALID_ARGUMENT"),
    ("grads too short", [], [_update("sgd", MINE[:2], grads=bytes(60))], "INVALID_ARGUMENT"),
    ("grad dtype", [], [_update("sgd", MINE[:1], grad_dtype="bfloat16")], "INVALID_ARGUMENT"),
    ("declared dim", [], [_update("sgd", MINE[:1], dim=4)], "INVALID_ARGUMENT"),
    ("lr zero", [], [_update("ada", MINE[:1], lr=0.0)], "INVALID_ARGUMENT"),
    ("a full table would overflow", [_pull("full", MINE[:9])], [], "RESOURCE_EXHAUSTED"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "pulls", "updates", "code"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_refused_request_is_untouched(
    node: Node, case: str, pulls: list[Any], updates: list[Any], code: str
) -> None:
    good = [_update("adam", MINE[:3]), _update("sgd", MINE[5:7])]
    request = ps_pb2.MultiPullRequest(
        items=[_pull("sgd", MINE[:3]), *pulls], updates=[*good, *updates]
    )
    before = _snapshot(node)
    with pytest.raises(RecStoreError) as info:
        native_path.serve(node, "MultiPull", request.SerializeToString())
    assert status_of(info.value) == getattr(grpc.StatusCode, code)
    assert _snapshot(node) == before
    assert node.tables["adam"].table.optimizer_state() == {"step": 0}  # no step counted


def test_the_exact_room_count_admits_keys_already_resident(node: Node) -> None:
    node.tables["full"].table.pull(MINE[:4])  # full now (4 rows a shard)
    request = ps_pb2.MultiPullRequest(items=[_pull("full", MINE[:4]), _pull("full", MINE[1:3])])
    served = native_path.serve(node, "MultiPull", request.SerializeToString())
    assert served.pulled == [("full", 4), ("full", 2)]
    request = ps_pb2.MultiPullRequest(items=[_pull("full", MINE[:5])])
    with pytest.raises(CapacityExhausted, match="table 'full' holds 4 of 4 rows; 1 new rows"):
        native_path.serve(node, "MultiPull", request.SerializeToString())


def test_read_only_pulls_wal_nodes_and_malformed_requests(tmp_path: Path) -> None:
    node = Node(tmp_path / "wal", wal_enabled=True)
    node.create_table(spec("sgd"), None)
    keys = np.arange(3)
    request = wire.encode_multi_update_request(
        [wire.UpdateRequest("sgd", 0, keys, np.ones((3, 8), np.float32), "float32", None, 8)]
    )
    served = native_path.serve(node, "MultiUpdate", request)  # the node logs it
    assert served.updated == [("sgd", 3)] and len(served.acks) == 1
    assert served.acks[0].wal is node.tables["sgd"].wal
    pulls = wire.encode_multi_pull_request([wire.PullRequest("sgd", 0, np.array([2, 5]), True)], [])
    (pulled,) = wire.decode_multi_pull_response(native_path.serve(node, "MultiPull", pulls).reply)
    assert bytes(pulled.found) == b"\x01\x00"
    values = np.frombuffer(pulled.values, np.float32).reshape(2, 8)
    np.testing.assert_array_equal(values[1], np.zeros(8))
    with pytest.raises(InvalidArgument, match="malformed MultiUpdateRequest"):
        native_path.serve(node, "MultiUpdate", b"\x0a\xff")  # truncated


_REAL_NATIVE = native_path._native


class _Failing:
    """A parsed request whose engine work fails after the checks."""

    def __init__(self, method: str, request: bytes, failure: tuple[Any, ...]) -> None:
        parsed = _REAL_NATIVE.MultiRequest(method, request)
        self.tables, self.update_tables = parsed.tables, parsed.update_tables
        self.failure = failure

    def serve(self, views: Any, natively: bool, reply_limit: int) -> tuple[Any, ...]:
        return ("failed", *self.failure)


@pytest.mark.parametrize(
    ("method", "capacity", "applied", "error"),
    [
        ("MultiPull", False, True, "CarriedUpdatesApplied"),  # the pulls failed after the updates
        ("MultiPull", True, False, "CapacityExhausted"),
        ("MultiUpdate", False, False, "InvalidArgument"),
    ],
)
def test_an_engine_failure_becomes_the_error_that_says_what_was_applied(
    node: Node, monkeypatch: pytest.MonkeyPatch, method: str, capacity: bool, applied: bool,
    error: str,
) -> None:  # fmt: skip
    from types import SimpleNamespace

    failure = ("engine said no", capacity, [(0, 2, 0)] if applied else [], 1)
    failing = SimpleNamespace(
        MultiRequest=lambda method, request: _Failing(method, request, failure)
    )
    monkeypatch.setattr(native_path, "_native", failing)
    update = wire.UpdateRequest("sgd", 0, MINE[:2], np.ones((2, 8), np.float32), "", None, 8)
    if method == "MultiPull":
        request = wire.encode_multi_pull_request([wire.PullRequest("sgd", 0, MINE[:2])], [update])
    else:
        request = wire.encode_multi_update_request([update])
    with pytest.raises(Exception, match="engine said no") as info:
        native_path.serve(node, method, request)
    assert type(info.value).__name__ == error


def test_every_refusal_code_the_engine_numbers_has_its_exception(node: Node) -> None:
    codes = [code for code in native_path.Code if code != native_path.Code.NONE]
    assert [int(code) for code in codes] == list(range(1, len(codes) + 1))
    for code in codes:
        error = native_path.refusal_error(code, 0, "sgd", "why", 3)
        assert status_of(error) is not None, code
    parsed = native_path.parse(
        "MultiPull", ps_pb2.MultiPullRequest(items=[_pull("nope", [1])]).SerializeToString()
    )
    refused = parsed.serve([None], True, 1 << 20)
    assert refused[:2] == ("refused", native_path.Code.TABLE_NOT_FOUND)
    assert isinstance(refused[1], native_path.Code)


def test_the_owned_slot_mask_is_a_typed_array_of_every_slot(node: Node) -> None:
    """The validator reads a hosted table's mask where it crosses into the engine: bool,
    one entry per slot, or it refuses before reading any of it."""
    request = ps_pb2.MultiPullRequest(items=[_pull("sgd", FOREIGN[:2])]).SerializeToString()
    view = list(native_path._view(node.get("sgd"), False))
    owned = view[1]
    assert owned.dtype == np.bool_ and owned.shape == (NUM_SLOTS,)
    refused = native_path.parse("MultiPull", request).serve([tuple(view)], True, 1 << 20)
    assert refused[:2] == ("refused", native_path.Code.WRONG_SHARD)  # the mask was read
    wrong = [
        (owned[:-1], ValueError, rf"owned slots of table 'sgd' must have shape \({NUM_SLOTS},\)"),
        (owned.astype(np.uint8), TypeError, "owned slots of table 'sgd' must be bool"),
        (owned.reshape(128, -1), ValueError, "owned slots of table 'sgd' must be 1-D"),
        (owned[::-1], TypeError, "must be C-contiguous"),
        (int(owned.ctypes.data), TypeError, "must be a numpy array or torch tensor"),
    ]
    for mask, kind, message in wrong:
        view[1] = mask
        with pytest.raises(kind, match=message):
            native_path.parse("MultiPull", request).serve([tuple(view)], True, 1 << 20)
