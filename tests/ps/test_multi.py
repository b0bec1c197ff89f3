# ruff: noqa: E501  (one bad item per line reads best as a table)
"""MultiPull / MultiUpdate: several tables per call, each item as its single call, all or nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core import (
    CapacityExhausted,
    InvalidArgument,
    SlotMap,
    TableNotFound,
    WrongShard,
    slot_of,
    wire,
)
from recstore.core.wire import WireClient
from recstore.ps import codec, multi, native_path
from recstore.ps.hosted_table import check_owned
from recstore.ps.node import Node, check_lr
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.store import Table
from recstore.v1 import ps_pb2

from .conftest import Client, spec

TABLES = {
    "sgd": spec("sgd", optimizer={"kind": "sgd", "lr": 0.5}),
    "ada": spec("ada", embedding_dim=4, optimizer={"kind": "adagrad", "lr": 0.1}),
    "adam": spec("adam", optimizer={"kind": "adam", "lr": 0.05}),
    "half": spec("half", dtype="float16", optimizer={"kind": "sgd", "lr": 0.25}),
    "hashed": spec("hashed", keys={"mode": "hashed", "capacity": 6}, initializer={"kind": "zeros"}),
}
KEYS = np.arange(1000, dtype=np.int64)


@pytest.fixture(autouse=True, params=["native path", "python path"])
def multi_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test against both ways a node serves multi-table calls."""
    if request.param == "python path":
        monkeypatch.setattr(native_path, "APPLY_NATIVELY", False)  # the node applies
    return str(request.param)


@pytest.fixture
def tables(client: Client) -> dict[str, Table]:
    """Every table on the node, and an in-process oracle of each."""
    for table in TABLES.values():
        client.create(table)
    return {name: Table(table) for name, table in TABLES.items()}


@pytest.fixture
def fast(node: ServerHandle) -> Iterator[WireClient]:
    with grpc.insecure_channel(node.address) as channel:
        yield WireClient(channel, timeout=60)


def grads_for(name: str, keys: np.ndarray, seed: int) -> np.ndarray:
    dim = TABLES[name].embedding_dim
    return np.random.default_rng(seed).standard_normal((len(keys), dim)).astype(np.float32)


def test_multi_pull_matches_the_engine_and_single_pulls(
    client: Client, fast: WireClient, tables: dict[str, Table]
) -> None:
    keys = {"sgd": np.array([5, 1, 5, 999]), "ada": np.array([7]), "half": np.array([], np.int64),
            "adam": np.arange(300)}  # fmt: skip
    items = [(name, k) for name, k in keys.items()] + [("sgd", np.array([2, 3]))]
    got = fast.multi_pull(items)
    for (name, k), (values, found) in zip(items, got, strict=True):
        assert found is None
        assert values.dtype == wire.WIRE_DTYPES[TABLES[name].dtype]
        np.testing.assert_array_equal(values, tables[name].pull(k))
        np.testing.assert_array_equal(values, fast.pull(name, k)[0])
    client.push("hashed", [11], np.full((1, 8), 3.0, np.float32))
    ((values, found), (_, others)) = fast.multi_pull(
        [("hashed", [11, 12]), ("ada", [7, 8])], read_only=True
    )
    assert found is not None and found.tolist() == [True, False]
    assert others is not None and others.tolist() == [True, False]  # 7 was pulled above
    np.testing.assert_array_equal(values, [[3.0] * 8, [0.0] * 8])


def test_multi_update_applies_each_item_in_order_like_single_updates(
    fast: WireClient, tables: dict[str, Table]
) -> None:
    for step in range(4):
        items = []
        for i, name in enumerate(["sgd", "ada", "adam", "half", "sgd"]):  # sgd twice: in order
            k = np.random.default_rng(step * 10 + i).integers(0, 1000, 50)
            items.append((name, k, grads_for(name, k, step * 10 + i)))
        rows = fast.multi_update(items, lr=0.2 if step % 2 else None)
        assert rows == [50] * 5
        for name, k, g in items:
            tables[name].update(k, g, 0.2 if step % 2 else None)
    for name in ["sgd", "ada", "adam", "half"]:
        np.testing.assert_allclose(fast.pull(name, KEYS)[0], tables[name].pull(KEYS), rtol=1e-6)


def test_generated_stub_speaks_multi_calls(client: Client, tables: dict[str, Table]) -> None:
    keys = np.array([4, 2], "<i8").tobytes()
    grads = np.ones((2, 8), "<f4").tobytes()
    request = ps_pb2.MultiUpdateRequest(
        items=[ps_pb2.UpdateRequest(table="sgd", keys=keys, grads=grads),
               ps_pb2.UpdateRequest(table="adam", keys=keys[:8], grads=grads[:32], lr=0.5)]
    )  # fmt: skip
    reply = client.call("MultiUpdate", request)
    assert [item.rows for item in reply.items] == [2, 1]
    tables["sgd"].update(np.array([4, 2]), np.ones((2, 8), np.float32))
    tables["adam"].update(np.array([4]), np.ones((1, 8), np.float32), 0.5)
    pulled = client.call(
        "MultiPull",
        ps_pb2.MultiPullRequest(
            items=[
                ps_pb2.PullRequest(table="sgd", keys=keys),
                ps_pb2.PullRequest(table="adam", keys=keys),
            ]
        ),
    )
    for item, name in zip(pulled.items, ["sgd", "adam"], strict=True):
        assert (item.dim, item.dtype) == (8, "float32")
        np.testing.assert_array_equal(
            np.frombuffer(item.values, "<f4").reshape(2, 8), tables[name].pull(np.array([4, 2]))
        )


def snapshot(client: Client) -> dict[str, Any]:
    out = {}
    for name in TABLES:
        values, found = client.find(name, KEYS)
        stats = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table=name))
        out[name] = (stats.size, values.tobytes(), found.tobytes())
    return out


def _item(table: str, keys: Any, rows_dim: int = 8, **fields: Any) -> ps_pb2.UpdateRequest:
    k = np.asarray(keys, "<i8")
    fields.setdefault("grads", np.ones((len(k), rows_dim), "<f4").tobytes())
    return ps_pb2.UpdateRequest(table=table, keys=k.tobytes(), **fields)


GOOD = [_item("sgd", [1, 2]), _item("adam", [3]), _item("ada", [4], rows_dim=4)]
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
BAD_ITEMS: list[tuple[str, Any, grpc.StatusCode]] = [
    ("unknown table", _item("nope", [1]), NOT_FOUND),
    ("grads too short", _item("sgd", [1, 2], grads=bytes(60)), INVALID),
    ("keys not int64-sized", ps_pb2.UpdateRequest(table="sgd", keys=bytes(7), grads=bytes(32)), INVALID),
    ("declared dim", _item("sgd", [1], dim=4), INVALID),
    ("grad dtype", _item("sgd", [1], grad_dtype="bfloat16"), INVALID),
    ("lr zero", _item("ada", [1], rows_dim=4, lr=0.0), INVALID),
    ("dense id too big", _item("adam", [5, 1000]), INVALID),
    ("negative dense id", _item("sgd", [-1]), INVALID),
    ("hashed table full", _item("hashed", [1, 2, 3, 4, 5, 6, 7]), grpc.StatusCode.RESOURCE_EXHAUSTED),
]  # fmt: skip


@pytest.mark.parametrize("position", [0, 1, 3])
@pytest.mark.parametrize(("case", "bad", "code"), BAD_ITEMS, ids=[c[0] for c in BAD_ITEMS])
def test_one_bad_item_leaves_every_table_unchanged(
    client: Client, tables: dict[str, Table], case: str, bad: Any, code: Any, position: int
) -> None:
    client.update("adam", [9], np.ones((1, 8), np.float32))  # adam has state and a step count
    tables["adam"].update(np.array([9]), np.ones((1, 8), np.float32))
    before = snapshot(client)
    items = [*GOOD[:position], bad, *GOOD[position:]]
    with pytest.raises(grpc.RpcError) as info:
        client.call("MultiUpdate", ps_pb2.MultiUpdateRequest(items=items))
    assert info.value.code() == code, info.value.details()
    details = info.value.details()
    assert f"item {position}" in details or "table 'hashed' holds" in details  # names the culprit
    assert snapshot(client) == before
    pulls = ps_pb2.MultiPullRequest(
        items=[ps_pb2.PullRequest(table=i.table, keys=i.keys) for i in items]
    )
    if code != INVALID or "id" in case or "int64" in case:  # a pull of the same keys fails too
        with pytest.raises(grpc.RpcError) as info:
            client.call("MultiPull", pulls)
        assert info.value.code() == code
        assert snapshot(client) == before  # nothing inserted either
    # the adam step count did not move: the next update agrees with the oracle
    client.update("adam", [9], np.ones((1, 8), np.float32))
    tables["adam"].update(np.array([9]), np.ones((1, 8), np.float32))
    np.testing.assert_allclose(
        client.pull("adam", [9]), tables["adam"].pull(np.array([9])), rtol=1e-6
    )


def test_foreign_slots_refuse_the_whole_request_with_the_epoch(tmp_path: Path) -> None:
    with start_in_thread(data_dir=tmp_path, shard_index=0, num_shards=2) as handle:
        c = Client(handle.address)
        c.create(spec("a", shards=2))
        c.create(spec("b", shards=2))
        owned = SlotMap.initial(2).owner_table()[slot_of(KEYS)] == 0
        mine, foreign = KEYS[owned][:3], KEYS[~owned][:1]
        before = {t: c.find(t, KEYS[owned]) for t in "ab"}
        items = [_item("a", mine), _item("b", np.concatenate([mine, foreign]))]
        for method, request in [
            ("MultiUpdate", ps_pb2.MultiUpdateRequest(items=items)),
            ("MultiPull", ps_pb2.MultiPullRequest(items=[ps_pb2.PullRequest(table=i.table, keys=i.keys) for i in items])),
        ]:  # fmt: skip
            with pytest.raises(grpc.RpcError) as info:
                c.call(method, request)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert ("x-recstore-epoch", "1") in info.value.trailing_metadata()
            for t in "ab":
                values, found = c.find(t, KEYS[owned])
                assert not found.any()
                np.testing.assert_array_equal(values, before[t][0])


def test_multi_calls_need_the_token(tmp_path: Path) -> None:
    with start_in_thread(data_dir=tmp_path, auth_token="s3") as handle:
        Client(handle.address, token="s3").create(spec("a"))
        with grpc.insecure_channel(handle.address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                WireClient(channel).multi_pull([("a", [1])])
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            authed = WireClient(channel, metadata=[("authorization", "Bearer s3")])
            assert authed.multi_update([("a", [1], np.ones((1, 8), np.float32))]) == [1]


def test_wal_records_every_item_before_the_reply(tmp_path: Path) -> None:
    from recstore.ps.wal import segments as wal_segments

    with start_in_thread(data_dir=tmp_path, durability="wal") as handle:
        c = Client(handle.address)
        c.create(spec("a"))
        c.create(spec("b", embedding_dim=4))
        with grpc.insecure_channel(handle.address) as channel:
            rows = WireClient(channel, timeout=60).multi_update(
                [("a", [1, 2], np.ones((2, 8), np.float32)), ("b", [3], np.ones((1, 4), np.float32)),
                 ("a", [4], np.ones((1, 8), np.float32))]
            )  # fmt: skip
        assert rows == [2, 1, 1]
        # acknowledged: the records are on disk already (no flush, no checkpoint)
        logged: dict[str, list[list[int]]] = {}
        for directory in (tmp_path / "wal").iterdir():
            records: list[Any] = []
            wal_segments.replay(directory, 0, records.append)
            logged[directory.name.rsplit("-", 1)[0]] = [r.keys.tolist() for r in records]
        assert logged == {"a": [[1, 2], [4]], "b": [[3]]}
        handle.stop(final_checkpoint=False)


def test_a_multi_pull_applies_the_updates_it_carries_before_it_pulls(
    client: Client, tables: dict[str, Table]
) -> None:
    keys = np.array([3, 1, 3, 8], "<i8")
    for step in range(3):  # adam: the step count moves once per carried update
        carried = [
            _item(name, keys, rows_dim=TABLES[name].embedding_dim,
                  grads=grads_for(name, keys, step * 7 + i).tobytes())
            for i, name in enumerate(["sgd", "ada", "adam"])
        ]  # fmt: skip
        reply = client.call(
            "MultiPull",
            ps_pb2.MultiPullRequest(
                items=[ps_pb2.PullRequest(table=n, keys=keys.tobytes()) for n in ("adam", "sgd")],
                updates=carried,
            ),
        )
        for i, name in enumerate(["sgd", "ada", "adam"]):
            tables[name].update(keys, grads_for(name, keys, step * 7 + i))
        assert [u.rows for u in reply.updates] == [4, 4, 4]
        for item, name in zip(reply.items, ["adam", "sgd"], strict=True):  # they read the updates
            np.testing.assert_allclose(
                np.frombuffer(item.values, "<f4").reshape(4, 8), tables[name].pull(keys), rtol=1e-6
            )


@pytest.mark.parametrize(
    ("pull", "code"),
    [
        (ps_pb2.PullRequest(table="nope", keys=np.array([1], "<i8").tobytes()), NOT_FOUND),
        (ps_pb2.PullRequest(table="adam", keys=np.array([1000], "<i8").tobytes()), INVALID),
        (ps_pb2.PullRequest(table="sgd", keys=bytes(5)), INVALID),
    ],
    ids=["unknown table", "dense id too big", "keys not int64-sized"],
)
def test_a_refused_pull_leaves_the_carried_updates_unapplied(
    client: Client, tables: dict[str, Table], pull: Any, code: Any
) -> None:
    before = snapshot(client)
    request = ps_pb2.MultiPullRequest(
        items=[ps_pb2.PullRequest(table="sgd", keys=np.array([2], "<i8").tobytes()), pull],
        updates=GOOD,
    )
    with pytest.raises(grpc.RpcError) as info:
        client.call("MultiPull", request)
    assert info.value.code() == code, info.value.details()
    assert snapshot(client) == before


def test_a_refused_carried_update_refuses_the_pulls_too(
    client: Client, tables: dict[str, Table]
) -> None:
    before = snapshot(client)
    request = ps_pb2.MultiPullRequest(
        items=[ps_pb2.PullRequest(table="hashed", keys=np.array([77], "<i8").tobytes())],
        updates=[*GOOD, _item("sgd", [1], dim=4)],
    )
    with pytest.raises(grpc.RpcError) as info:
        client.call("MultiPull", request)
    assert info.value.code() == INVALID and "item 3" in info.value.details()
    assert snapshot(client) == before  # no update applied, no row inserted by the pull


def test_pulls_failing_after_the_carried_updates_say_those_are_applied(
    client: Client, tables: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native_path, "APPLY_NATIVELY", False)  # the Python path's case

    def dropped_meanwhile(items: Any, outs: Any) -> None:
        raise TableNotFound("table 'sgd' is not hosted on this node")

    monkeypatch.setattr(multi, "pull_items", dropped_meanwhile)
    request = ps_pb2.MultiPullRequest(
        items=[ps_pb2.PullRequest(table="sgd", keys=np.array([1], "<i8").tobytes())],
        updates=[GOOD[0]],
    )
    with pytest.raises(grpc.RpcError) as info:
        client.call("MultiPull", request)
    assert info.value.code() == grpc.StatusCode.ABORTED
    assert "carried updates were applied" in info.value.details()
    tables["sgd"].update(np.array([1, 2]), np.ones((2, 8), np.float32))
    np.testing.assert_array_equal(client.pull("sgd", [1, 2]), tables["sgd"].pull(np.array([1, 2])))


@pytest.mark.parametrize("method", [wire.MULTI_PULL, wire.MULTI_UPDATE])
@pytest.mark.parametrize("request_bytes", [b"\x0f", b"\x0a\x03em", b"\x0a\x05\x0a\x03\xff\xfe\xfd"])
def test_malformed_multi_requests_are_invalid(
    node: ServerHandle, request_bytes: bytes, method: str
) -> None:
    with grpc.insecure_channel(node.address) as channel, pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(method)(request_bytes, timeout=60)
    assert info.value.code() == INVALID and "malformed" in (info.value.details() or "")


def _check_key_range(hosted: Any, keys: np.ndarray) -> None:
    """Dense ids must lie in [0, num_embeddings)."""
    limit = hosted.id_limit
    if limit is None or not len(keys) or int(keys.view(np.uint64).max()) < limit:
        return
    low, high = int(keys.min()), int(keys.max())
    raise InvalidArgument(
        f"id {low if low < 0 else high} is out of range for dense table "
        f"{hosted.entry.spec.name!r} (0..{limit - 1})"
    )


def _item_error(index: int, table: str, error: Exception) -> Exception:
    where = f"item {index} (table {table!r}): {error}"
    if isinstance(error, WrongShard):
        return WrongShard(where, error.epoch)
    if isinstance(error, InvalidArgument | TableNotFound | CapacityExhausted):
        return type(error)(where)
    return error


def _item_wise_refusal(node: Node, items: list[ps_pb2.UpdateRequest]) -> Exception | None:
    """The first refusal of the checks of each update item in turn (the reference order)."""
    for index, item in enumerate(items):
        try:
            hosted = node.get(item.table)
            codec.check_declared("", item.dim, hosted.dtype, hosted.dim)
            grad_dtype = codec.grad_dtype_for(item.grad_dtype, hosted.dtype)
            keys = codec.decode_keys(item.keys)
            codec.decode_rows(item.grads, len(keys), hosted.dim, grad_dtype, "grads")
            check_lr(item.lr if item.HasField("lr") else None)
            check_owned(hosted, keys)
            _check_key_range(hosted, keys)
        except Exception as error:
            return _item_error(index, item.table, error)
    return None


def _multi_update(node: Node, items: list[ps_pb2.UpdateRequest]) -> None:
    request = ps_pb2.MultiUpdateRequest(items=items).SerializeToString()
    native_path.serve(node, "MultiUpdate", request)


def _check_pulls(node: Node, items: list[ps_pb2.UpdateRequest]) -> None:
    pulls = [ps_pb2.PullRequest(table=i.table, keys=i.keys, read_only=True) for i in items]
    native_path.serve(node, "MultiPull", ps_pb2.MultiPullRequest(items=pulls).SerializeToString())


def test_checks_over_all_items_refuse_as_the_item_wise_checks(tmp_path: Path) -> None:
    """Keys are checked for every item at once: the refusal is still the first item-wise one."""
    node = Node(tmp_path, shard_index=0, num_shards=2)
    other_map = {"epoch": 2, "ranges": [[0, 5000, 0], [5000, 16384, 1]]}
    node.create_table(spec("a", shards=2), None)
    node.create_table(spec("b", shards=2, embedding_dim=4), None)  # a's slot map
    node.create_table(spec("c", shards=2), SlotMap.from_dict(other_map))
    node.create_table(spec("h", shards=2, keys={"mode": "hashed", "capacity": 10**4}), None)
    node.create_table(spec("whole"), SlotMap.initial(1))  # owns every slot
    dims = {"a": 8, "b": 4, "c": 8, "h": 8, "whole": 8}
    owned = {t: node.get(t).owned_slots for t in dims}
    assert owned["a"] is owned["b"] and owned["whole"] is None

    def keys_for(rng: np.random.Generator, table: str) -> np.ndarray:
        keys = rng.integers(0, 1000, int(rng.integers(0, 6)))
        mask = owned[table]
        mine = keys if mask is None else keys[mask[slot_of(keys)]]
        roll = rng.random()
        if roll < 0.1 and len(keys):
            return keys  # maybe foreign
        if roll < 0.2:
            return np.append(mine, rng.choice([-1, 1000, 2**62]))  # out of range when dense
        return mine

    rng = np.random.default_rng(0)
    refused = 0
    for _ in range(400):
        items = []
        for _ in range(int(rng.integers(1, 5))):
            table = str(rng.choice([*dims, "nope"] if rng.random() < 0.15 else list(dims)))
            keys = keys_for(rng, table if table != "nope" else "a")
            grads = np.ones((len(keys), dims.get(table, 8)), "<f4").tobytes()
            items.append(
                ps_pb2.UpdateRequest(table=table, keys=keys.astype("<i8").tobytes(), grads=grads)
            )
        expected = _item_wise_refusal(node, items)
        # pulls resolve every table before checking any keys (as they always have)
        missing = next((i for i, item in enumerate(items) if item.table == "nope"), None)
        expected_pull = expected
        if missing is not None:
            expected_pull = TableNotFound(
                f"item {missing} (table 'nope'): table 'nope' is not hosted on this node"
            )
        for want, check in ((expected, _multi_update), (expected_pull, _check_pulls)):
            if want is None:
                check(node, items)
                continue
            with pytest.raises(type(want)) as info:
                check(node, items)
            assert str(info.value) == str(want)
        refused += expected is not None
    assert 100 < refused < 300  # both kinds of request were tried


def test_both_encodings_of_multi_requests_are_read_alike(tmp_path: Path) -> None:
    """wire's encoding and the generated classes' (field order, alignment) serve alike."""
    keys = np.arange(5, dtype="<i8")
    grads = np.ones((5, 8), "<f4")
    updates = [wire.UpdateRequest("a", 3, keys, grads, "float32", 0.5, 8),
               wire.UpdateRequest("b", 0, b"", b"", "", None, 0)]  # fmt: skip
    pulls = [wire.PullRequest("a", 1, keys, True), wire.PullRequest("b", 0, b"", False)]
    generated = ps_pb2.MultiPullRequest(
        items=[ps_pb2.PullRequest(table="a", keys=keys.tobytes(), read_only=True), ps_pb2.PullRequest(table="b")],
        updates=[ps_pb2.UpdateRequest(table="a", keys=keys.tobytes(), grads=grads.tobytes(), grad_dtype="float32", lr=0.5, dim=8),
                 ps_pb2.UpdateRequest(table="b")],
    ).SerializeToString()  # fmt: skip
    replies = []
    for i, encoded in enumerate((wire.encode_multi_pull_request(pulls, updates), generated)):
        node = Node(tmp_path / str(i))
        node.create_table(spec("a"), None)
        node.create_table(spec("b"), None)
        served = native_path.serve(node, "MultiPull", encoded)
        assert (served.pulled, served.updated) == ([("a", 5), ("b", 0)], [("a", 5), ("b", 0)])
        items, applied = wire.decode_multi_pull_reply(served.reply)
        versions = [node.tables["a"].version, node.tables["b"].version]
        # each item carries its table's version on this node (read before the updates)
        assert all(0 < i.version <= now for i, now in zip(items, versions, strict=True))
        replies.append(
            ([(bytes(r.values), r.dim, r.dtype, bytes(r.found)) for r in items], applied)
        )
        update = wire.encode_multi_update_request(updates)
        assert native_path.serve(node, "MultiUpdate", update).updated == [("a", 5), ("b", 0)]
    assert replies[0] == replies[1]
    for malformed in (b"\x0f", b"\x0a\x03em", b"\x0a\x05\x0a\x03\xff\xfe\xfd"):
        for method in ("MultiPull", "MultiUpdate"):
            with pytest.raises(InvalidArgument, match="malformed"):
                native_path.serve(node, method, malformed)


def test_big_requests_are_served_alike(
    fast: WireClient, tables: dict[str, Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = np.arange(40, dtype=np.int64)
    items = [(name, keys, grads_for(name, keys, i)) for i, name in enumerate(["sgd", "ada"])]
    assert fast.multi_update(items, lr=0.3) == [40, 40]
    for name, k, g in items:
        tables[name].update(k, g, 0.3)
    pulled = fast.multi_pull([(name, keys) for name, *_ in items])
    for (name, *_), (values, _) in zip(items, pulled, strict=True):
        np.testing.assert_allclose(values, tables[name].pull(keys), rtol=1e-6)
