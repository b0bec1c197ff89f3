"""The native multi-table planner and encoder: the Python oracle's requests byte for byte,
at any byte bound; replies."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from recstore import _native as native_module
from recstore.client.remote.requests import TableCall, native_requests
from recstore.core import NUM_SLOTS, SlotMap, wire

from .multi_oracle import python_requests

native: Any = native_module
NODES = ("10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1")
BIG = 1 << 30


def _table(
    name: str, dim: int, endpoints: tuple[str, ...], epoch: int = 0, transport: str = ""
) -> Any:
    initial = SlotMap.initial(len(endpoints))
    slot_map = SlotMap(epoch=epoch, ranges=initial.ranges)
    spec = SimpleNamespace(name=name, embedding_dim=dim, row_bytes=dim * 4)
    return SimpleNamespace(
        spec=spec, endpoints=endpoints, router=SimpleNamespace(slot_map=slot_map),
        transport=transport,
    )  # fmt: skip


def _call(table: Any, keys: np.ndarray, rows: np.ndarray, **kwargs: Any) -> TableCall:
    return TableCall(table, np.ascontiguousarray(keys, np.int64), rows, **kwargs)


def _cases() -> list[tuple[str, list[TableCall], list[TableCall]]]:
    rng = np.random.default_rng(7)
    keys = [rng.integers(-(2**62), 2**62, n) for n in (50, 1, 0, 300, 17)]
    two, three = NODES[:2], NODES
    tables = [
        _table("a", 16, two), _table("b", 3, two, epoch=2**40), _table("c", 8, three, epoch=5),
        _table("d", 64, three), _table("e", 5, (NODES[2], NODES[0])),
    ]  # fmt: skip
    pulls = [
        _call(t, k, np.empty((len(k), t.spec.embedding_dim), np.float32))
        for t, k in zip(tables, keys, strict=True)
    ]
    updates = [
        _call(tables[0], keys[0], rng.standard_normal((50, 16)).astype(np.float32)),
        _call(tables[1], keys[1], rng.standard_normal((1, 3)).astype(np.float16), lr=0.25),
        _call(
            tables[2], keys[3][:4], rng.standard_normal((4, 8)).astype(np.float32), every_shard=True
        ),
        _call(tables[3], keys[2], np.empty((0, 64), np.uint16), every_shard=True),
        _call(tables[4], keys[4], rng.standard_normal((17, 5)).astype(np.float32), lr=1e-3),
    ]
    # float32 tables whose rows and gradients travel in 16 bits
    narrow = [
        _table("f", 16, two, transport="bfloat16"),
        _table("g", 8, three, transport="float16"),
    ]
    narrow_pulls = [
        _call(narrow[0], keys[0], np.empty((50, 16), np.float32)),
        _call(narrow[1], keys[3], np.empty((300, 8), np.float32)),
    ]
    narrow_updates = [
        _call(narrow[0], keys[0], rng.standard_normal((50, 16)).astype(np.float32)),
        _call(narrow[1], keys[3], rng.standard_normal((300, 8)).astype(np.float32), lr=0.5),
    ]
    # a cache's pulls: nodes asked for the table's version even without keys of theirs
    asking = [
        _call(tables[2], keys[1], np.empty((1, 8), np.float32), also_ask=frozenset(three)),
        _call(tables[0], keys[2], np.empty((0, 16), np.float32), also_ask=frozenset(two[1:])),
    ]
    return [
        ("pulls", pulls, []),
        ("pulls carrying updates", pulls, updates),
        ("updates only ride where they go", pulls[:1], updates[2:]),
        ("updates", updates, []),
        ("16-bit transport", [*narrow_pulls, pulls[0]], narrow_updates),
        ("16-bit updates", narrow_updates, []),
        ("pulls asking for versions", [*asking, pulls[3]], updates[:1]),
    ]


def _by_endpoint(requests: Any) -> dict[str, Any]:
    """Each node's requests in the order they were planned: body and items."""
    out: dict[str, list[Any]] = {}
    for r in requests:
        out.setdefault(r.endpoint, []).append((
            r.body,
            [(p.index, p.positions.tolist(), p.epoch) for p in r.parts],
            [(p.index, p.positions.tolist(), p.epoch) for p in r.carried],
        ))  # fmt: skip
    return out


@pytest.mark.parametrize("max_bytes", [BIG, 1000, 200, 1], ids=["whole", "1000", "200", "1"])
@pytest.mark.parametrize(("case", "calls", "carried"), _cases(), ids=[c[0] for c in _cases()])
def test_native_requests_are_the_python_planners_byte_for_byte(
    case: str, calls: list[TableCall], carried: list[TableCall], max_bytes: int
) -> None:
    """Whole or cut at the byte bound (a row at most: 1), and None alike where the carried
    updates cannot ride."""
    method = "MultiUpdate" if case in ("updates", "16-bit updates") else "MultiPull"
    got = native_requests(method, calls, carried, max_bytes)
    expected = python_requests(method, calls, carried, max_bytes)
    if expected is None:
        assert got is None and carried and max_bytes < BIG
        return
    assert got is not None
    assert _by_endpoint(got) == _by_endpoint(expected)
    for request in got:  # and the generated classes read them
        if method == "MultiPull":
            message = wire.decode_multi_pull_carrying(request.body)
            assert len(message[0]) == len(request.parts)
            assert len(message[1]) == len(request.carried)
    sent = {}  # every key goes exactly once (an item asked of a node without keys: empty)
    for request in got:
        for part in request.parts:
            sent.setdefault(part.index, []).extend(part.positions.tolist())
    for index, call in enumerate(calls):
        assert sorted(sent.get(index, [])) == list(range(len(call.keys)))


def test_a_pull_asking_for_versions_reaches_every_node_it_names() -> None:
    _, calls, carried = _cases()[-1]
    for plan in (native_requests, python_requests):
        requests = plan("MultiPull", calls, carried, BIG)
        assert requests is not None
        items = {r.endpoint: [(p.index, len(p.positions)) for p in r.parts] for r in requests}
        # table c (1 key) is asked of all three nodes, table a (no keys) of the second only
        assert all(any(i == 0 for i, _ in items[node]) for node in NODES)
        assert (1, 0) in items[NODES[1]]
        assert all(i != 1 for i, _ in items[NODES[0]] + items[NODES[2]])
        assert sum(n for node in NODES for i, n in items[node] if i == 0) == 1


def test_versions_are_asked_for_past_the_byte_bound_too() -> None:
    table = _table("a", 4, NODES[:2])
    call = _call(table, np.arange(40), np.empty((40, 4), np.float32), also_ask=frozenset(NODES))
    requests = native_requests("MultiPull", [call], [], 64)  # 4 rows of 16 bytes a request
    assert requests is not None and len(requests) > 2
    assert {r.endpoint for r in requests} == set(NODES[:2])
    assert sum(len(p.positions) for r in requests for p in r.parts) == 40
    assert all(len(p.positions) <= 4 for r in requests for p in r.parts)


def test_updates_that_cannot_ride_within_the_bound_are_left_to_the_caller() -> None:
    _, calls, carried = _cases()[1]
    assert native_requests("MultiPull", calls, carried, 1000) is None
    assert native_requests("MultiPull", calls, [], 1000) is not None


def _version(table: str) -> int:
    return 1000 + ord(table)


def _answer(body: bytes, calls: list[TableCall], applied: int = 3) -> bytes:
    """A node's reply: each pulled row is key * 10 + column, in the table's dim; each
    item's version is ``_version`` of its table."""
    pulls, updates = wire.decode_multi_pull_carrying(body)
    dims = {c.name: c.table.spec.embedding_dim for c in calls}
    shapes = [(len(p.keys) // 8, dims[p.table], "float32", False) for p in pulls]
    message, outs = wire.multi_pull_response_frame(
        shapes, carried_rows=[applied] * len(updates), versions=[_version(p.table) for p in pulls]
    )
    for pull, (values, _) in zip(pulls, outs, strict=True):
        keys = np.frombuffer(pull.keys, np.int64)
        values[:] = keys[:, None] * 10.0 + np.arange(values.shape[1])
    return wire.finish(message)


def test_replies_are_scattered_back_to_each_tables_rows() -> None:
    _, calls, carried = _cases()[1]
    requests = native_requests("MultiPull", calls, carried, BIG)
    assert requests is not None
    for request in requests:
        assert request.targets is not None
        applied, versions = native.scatter_pull_reply(
            _answer(request.body, calls), request.targets, len(request.carried)
        )
        assert applied == [3] * len(request.carried)
        assert versions == [_version(calls[p.index].name) for p in request.parts]
    for call in calls:
        expected = call.keys[:, None] * 10.0 + np.arange(call.table.spec.embedding_dim)
        np.testing.assert_array_equal(call.rows, expected.astype(np.float32))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda reply: reply[:-3], "truncated"),
        (lambda reply: reply + b"\x0a\x00", "items"),  # one more (empty) item
        (lambda reply: b"", "items"),
    ],
    ids=["truncated", "an extra item", "empty"],
)
def test_a_malformed_reply_is_refused(damage: Any, message: str) -> None:
    _, calls, carried = _cases()[1]
    requests = native_requests("MultiPull", calls, carried, BIG)
    assert requests is not None
    request = requests[0]
    with pytest.raises(ValueError, match=message):
        native.scatter_pull_reply(
            damage(_answer(request.body, calls)), request.targets, len(request.carried)
        )


def test_a_reply_of_another_dim_is_refused() -> None:
    table = _table("a", 4, NODES[:1])
    call = _call(table, np.arange(5), np.zeros((5, 4), np.float32))
    (request,) = native_requests("MultiPull", [call], [], BIG) or []
    table.spec.embedding_dim = 2  # the node answers rows of dim 2
    with pytest.raises(ValueError, match="dim 2"):
        native.scatter_pull_reply(_answer(request.body, [call]), request.targets, 0)
    np.testing.assert_array_equal(call.rows, 0)  # nothing copied


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="not a multi-table method"):
        native.encode_multi("Pull", [], [], 1, BIG)
    with pytest.raises(ValueError, match="num_nodes"):
        native.encode_multi("MultiPull", [], [], 0, BIG)
    with pytest.raises(ValueError, match="max_bytes"):
        native.encode_multi("MultiPull", [], [], 1, 0)
    table = _table("a", 4, NODES[:1])
    bad = _call(table, np.arange(3), np.zeros((3, 4), np.float32))
    bad.keys = bad.keys.astype(np.int32)
    with pytest.raises(TypeError, match="keys of table 'a' must be int64, got int32"):
        native_requests("MultiPull", [bad], [], BIG)


def _refused(kind: type[Exception], message: str, pulls: Any = (), updates: Any = ()) -> None:
    with pytest.raises(kind, match=message):
        native_requests("MultiPull", list(pulls), list(updates), BIG)


def test_the_encoder_types_every_array_it_reads() -> None:
    """Keys, gradients and owners arrive as arrays whose dtype, rank, layout and size are
    checked where they cross into the engine: never converted, never read past their end."""
    table = _table("a", 4, NODES[:2])
    pull = _call(table, np.arange(6), np.zeros((6, 4), np.float32))
    strided = _call(table, np.arange(12)[::2], np.zeros((6, 4), np.float32))
    strided.keys = np.arange(12, dtype=np.int64)[::2]
    _refused(TypeError, "keys of table 'a' must be C-contiguous", [strided])
    two_d = _call(table, np.arange(6), np.zeros((6, 4), np.float32))
    two_d.keys = two_d.keys.reshape(2, 3)
    _refused(ValueError, "keys of table 'a' must be 1-D", [two_d])
    listed = _call(table, np.arange(6), np.zeros((6, 4), np.float32))
    listed.keys = [1, 2, 3]  # type: ignore[assignment]
    _refused(TypeError, "keys of table 'a' must be a numpy array or torch tensor", [listed])
    cases = [
        (np.zeros((5, 4), np.float32), ValueError, r"must be one row per key \(6\), got shape"),
        (np.zeros((6, 4), np.float64), TypeError, "must be float32, float16 or bfloat16"),
        (np.zeros((4, 6), np.float32).T, TypeError, "must be C-contiguous"),
        (np.zeros(24, np.float32), ValueError, "must be 2-D"),
    ]
    for grads, kind, message in cases:
        update = _call(table, np.arange(6), grads)
        _refused(kind, f"gradients of table 'a' {message}", [pull], [update])


def test_a_node_of_slot_table_must_cover_every_slot() -> None:
    keys = np.arange(5, dtype=np.int64)
    pull = ("a", 0, keys, np.zeros(NUM_SLOTS - 1, np.int32), "", [], 16)
    with pytest.raises(
        ValueError, match=f"node_of_slot of table 'a' must have shape \\({NUM_SLOTS},\\)"
    ):
        native.encode_multi("MultiPull", [pull], [], 1, BIG)
    wide = ("a", 0, keys, np.zeros(NUM_SLOTS, np.int64), "", [], 16)
    with pytest.raises(TypeError, match="node_of_slot of table 'a' must be int32"):
        native.encode_multi("MultiPull", [wide], [], 1, BIG)


def test_scatter_targets_are_typed_and_bounded() -> None:
    table = _table("a", 4, NODES[:1])
    call = _call(table, np.arange(5), np.zeros((5, 4), np.float32))
    (request,) = native_requests("MultiPull", [call], [], BIG) or []
    assert request.targets is not None
    reply = _answer(request.body, [call])
    (target,) = request.targets
    out, transport, dim, order, offset, count = target
    assert out is call.rows  # the caller's own rows: written in place, no copy
    frozen = call.rows.copy()
    frozen.flags.writeable = False
    rest = (dim, order, offset, count)
    wrong = [
        ((frozen, transport, *rest), TypeError, "target 0 rows must be writable"),
        ((out.astype(np.float64), transport, *rest), TypeError, "float32"),
        ((out, transport, 8, order, offset, count), ValueError, "rows of dim 8, got shape"),
        ((out, transport, dim, order.astype(np.int32), offset, count), TypeError, "int64"),
        ((out, transport, dim, order, offset, count + 1), ValueError, "do not fit its 5 positions"),
        ((out, transport, dim, order, -1, count), ValueError, "offset -1"),
        ((out, transport, dim, order + 3, offset, count), ValueError, "position 5 is not one"),
    ]
    for bad, kind, message in wrong:
        with pytest.raises(kind, match=message):
            native.scatter_pull_reply(reply, [bad], 0)
    np.testing.assert_array_equal(call.rows, 0)  # nothing copied by a refused call
    native.scatter_pull_reply(reply, [target], 0)
    expected = call.keys[:, None] * 10.0 + np.arange(4)
    np.testing.assert_array_equal(call.rows, expected.astype(np.float32))


def test_16_bit_transport_narrows_gradients_and_widens_pulled_rows() -> None:
    _, calls, carried = _cases()[4]
    requests = native_requests("MultiPull", calls, carried, BIG)
    assert requests is not None
    for request in requests:
        pulls, updates = wire.decode_multi_pull_carrying(request.body)
        assert {p.table: p.value_dtype for p in pulls} == {
            p.table: {"f": "bfloat16", "g": "float16", "a": ""}[p.table] for p in pulls
        }
        for u in updates:  # half the bytes, rounded to nearest even from the float32 rows
            assert u.grad_dtype == {"f": "bfloat16", "g": "float16"}[u.table]
            assert len(u.grads) == len(u.keys) // 8 * {"f": 16, "g": 8}[u.table] * 2
        # the node answers in the dtype asked for; the scatter widens into the float32 rows
        dims = {c.name: c.table.spec.embedding_dim for c in calls}
        shapes = [
            (len(p.keys) // 8, dims[p.table], p.value_dtype or "float32", False) for p in pulls
        ]
        message, outs = wire.multi_pull_response_frame(shapes, carried_rows=[1] * len(updates))
        for pull, (values, _) in zip(pulls, outs, strict=True):
            keys = np.frombuffer(pull.keys, np.int64)
            exact = (keys[:, None] % 32 + np.arange(values.shape[1]) / 4).astype(np.float32)
            values[:] = wire.as_wire_dtype(exact, pull.value_dtype or "float32")
        native.scatter_pull_reply(wire.finish(message), request.targets, len(request.carried))
    for call in calls:
        exact = call.keys[:, None] % 32 + np.arange(call.table.spec.embedding_dim) / 4
        np.testing.assert_array_equal(call.rows, exact.astype(np.float32))  # exact in 16 bits
    grads = carried[0].rows
    narrowed = wire.as_wire_dtype(grads, "bfloat16")
    assert narrowed.dtype == np.uint16
    widened = wire.as_wire_dtype(narrowed, "float32")
    np.testing.assert_allclose(widened, grads, rtol=2**-8)
