"""ExportRows / ImportRows on real loopback nodes: rows with their optimizer state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core import NUM_SLOTS, SlotMap, slot_of
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, spec

DIM = 8
KEYS = np.arange(300)
ADAGRAD = {"kind": "adagrad", "lr": 0.1}
ADMIN, READER = "admin-token", "reader-token"


def export(client: Client, table: str = "emb", **fields: Any) -> list[ps_pb2.ExportRowsChunk]:
    request = ps_pb2.ExportRowsRequest(table=table, **fields)
    return list(client.stub.ExportRows(request, metadata=client.metadata, timeout=60))


def import_(client: Client, chunks: list[ps_pb2.ExportRowsChunk]) -> ps_pb2.ImportRowsResponse:
    return client.stub.ImportRows(iter(chunks), metadata=client.metadata, timeout=60)


def rows_of(chunks: list[ps_pb2.ExportRowsChunk]) -> dict[int, tuple[bytes, bytes]]:
    """key -> (value bytes, state bytes) of every exported row."""
    out = {}
    for chunk in chunks:
        keys = np.frombuffer(chunk.keys, "<i8")
        values = np.frombuffer(chunk.values, "<f4").reshape(len(keys), chunk.dim)
        state = np.frombuffer(chunk.state, "<f4").reshape(len(keys), chunk.state_width)
        for i, key in enumerate(keys):
            out[int(key)] = (values[i].tobytes(), state[i].tobytes())
    return out


def chunk(ids: Any, *, dim: int = DIM, width: int = DIM, **fields: Any) -> ps_pb2.ExportRowsChunk:
    keys = np.asarray(ids, "<i8")
    base: dict[str, Any] = {
        "table": "emb",
        "keys": keys.tobytes(),
        "values": np.full((len(keys), dim), 3.0, "<f4").tobytes(),
        "state": np.full((len(keys), width), 0.5, "<f4").tobytes(),
        "dtype": "float32",
        "dim": dim,
        "state_width": width,
    }
    return ps_pb2.ExportRowsChunk(**(base | fields))


def failure(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details()


@pytest.fixture
def trained(client: Client) -> Client:
    client.create(spec(optimizer=ADAGRAD))
    rng = np.random.default_rng(0)
    client.pull("emb", KEYS)
    for _ in range(3):
        keys = rng.integers(0, 300, 64)
        client.update("emb", keys, rng.standard_normal((64, DIM)).astype("<f4"))
    return client


@pytest.fixture
def other(tmp_path: Path) -> Iterator[Client]:
    handle = start_in_thread(data_dir=tmp_path / "other")
    c = Client(handle.address)
    c.create(spec(optimizer=ADAGRAD))
    yield c
    c.close()
    handle.stop(final_checkpoint=False)


def test_rows_and_state_move_to_another_node_and_train_on_alike(trained, other) -> None:
    chunks = export(trained, with_state=True)
    assert all(c.state_width == DIM and c.dtype == "float32" for c in chunks)
    reply = import_(other, chunks)
    assert (reply.rows, reply.chunks) == (len(KEYS), len(chunks))
    assert rows_of(export(other, with_state=True)) == rows_of(chunks)
    grads = np.random.default_rng(5).standard_normal((len(KEYS), DIM)).astype("<f4")
    for node in (trained, other):  # the adagrad accumulators came along
        node.update("emb", KEYS, grads)
    np.testing.assert_array_equal(other.pull("emb", KEYS), trained.pull("emb", KEYS))


def test_without_state_only_values_travel(trained) -> None:
    chunks = export(trained)
    assert all(c.state == b"" and c.state_width == 0 for c in chunks)
    keys = np.concatenate([np.frombuffer(c.keys, "<i8") for c in chunks])
    values = np.concatenate([np.frombuffer(c.values, "<f4") for c in chunks])
    np.testing.assert_array_equal(values.reshape(-1, DIM), trained.pull("emb", keys))


def test_chunks_stay_within_the_asked_bytes(trained) -> None:
    bound = 40 * (8 + DIM * 4 + DIM * 4)  # 40 rows with state
    chunks = export(trained, with_state=True, max_chunk_bytes=bound)
    assert len(chunks) == -(-len(KEYS) // 40)
    assert all(len(c.keys) + len(c.values) + len(c.state) <= bound for c in chunks)
    assert sorted(rows_of(chunks)) == list(KEYS)


def test_a_slot_mask_selects_the_rows_of_its_slots(trained) -> None:
    slots = slot_of(KEYS)
    wanted = np.zeros(NUM_SLOTS, np.uint8)
    wanted[np.unique(slots)[::2]] = 1
    picked = sorted(rows_of(export(trained, with_state=True, slot_mask=wanted.tobytes())))
    assert picked == sorted(int(k) for k in KEYS[wanted[slots] == 1])
    rest = sorted(rows_of(export(trained, slot_mask=(1 - wanted).tobytes())))
    assert sorted(picked + rest) == list(KEYS)


def test_keys_select_rows_and_a_missing_key_is_left_out(trained) -> None:
    keys = np.array([7, 3, 299], "<i8")
    reply = rows_of(export(trained, with_state=True, keys=keys.tobytes()))
    assert list(reply) == [7, 3, 299]
    assert reply == {k: v for k, v in _state_before(trained).items() if k in (7, 3, 299)}
    trained.create(spec("sparse", optimizer=ADAGRAD))
    assert export(trained, "sparse", keys=keys.tobytes()) == []  # no row is resident


@pytest.mark.parametrize(
    ("fields", "code", "says"),
    [
        ({"slot_mask": b"\x01" * 10}, grpc.StatusCode.INVALID_ARGUMENT, "one entry per slot"),
        ({"keys": b"\x01" * 10}, grpc.StatusCode.INVALID_ARGUMENT, "whole number of int64"),
        ({"keys": np.array([5000], "<i8").tobytes()}, grpc.StatusCode.INVALID_ARGUMENT, "5000"),
        ({"table": "nope"}, grpc.StatusCode.NOT_FOUND, "nope"),
    ],
)
def test_a_bad_export_is_refused(trained, fields, code, says) -> None:
    got, details = failure(lambda: export(trained, **fields))
    assert got == code and says in details


def _state_before(client: Client) -> dict[int, tuple[bytes, bytes]]:
    return rows_of(export(client, with_state=True))


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (chunk([1, 2], dtype="float16"), "does not match the table dtype"),
        (chunk([1, 2], dim=4), "does not match the table dim"),
        (chunk([1, 2], width=3), "state_width 3 does not match the table's 8"),
        (chunk([1, 2], values=b"\x00" * 12), "values buffer has 12 bytes"),
        (chunk([1, 2], state=b"\x00" * 12), "state buffer has 12 bytes"),
        (chunk([1, 2], keys=b"\x00" * 12), "not a whole number of int64 keys"),
        (chunk([1, 2], state_width=0, state=b""), None),  # values alone: accepted (control)
    ],
)
def test_a_bad_chunk_is_refused_and_changes_nothing(trained, bad, says) -> None:
    before = _state_before(trained)
    if says is None:
        assert import_(trained, [bad]).rows == 2
        after = _state_before(trained)
        assert after[1][1] == before[1][1]  # values alone keep the row's optimizer state
        assert after[1][0] == np.full(DIM, 3.0, "<f4").tobytes()
        return
    code, details = failure(lambda: import_(trained, [bad]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and says in details
    assert _state_before(trained) == before


def test_a_refused_chunk_ends_the_stream_and_says_what_was_applied(trained) -> None:
    good, bad = chunk([900, 901]), chunk([902], dim=4)
    code, details = failure(lambda: import_(trained, [good, bad]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "2 rows of the 1 chunks before this one were applied" in details
    assert set(rows_of(export(trained))) >= {900, 901}
    assert 902 not in rows_of(export(trained))


def test_rows_of_slots_another_shard_owns_are_refused_whole(tmp_path: Path) -> None:
    handle = start_in_thread(data_dir=tmp_path, shard_index=0, num_shards=2)
    client = Client(handle.address)
    try:
        client.create(spec(optimizer=ADAGRAD, shards=2))
        owners = SlotMap.initial(2).owner_table()
        mine = next(k for k in range(100) if owners[slot_of(np.array([k]))[0]] == 0)
        foreign = next(k for k in range(100) if owners[slot_of(np.array([k]))[0]] == 1)
        code, details = failure(lambda: import_(client, [chunk([mine, foreign])]))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "does not own" in details
        assert export(client) == []
    finally:
        client.close()
        handle.stop(final_checkpoint=False)


def test_state_for_an_inference_table_is_refused_values_alone_load(client: Client) -> None:
    client.create(spec("frozen", optimizer=ADAGRAD, mode="inference"))
    code, details = failure(lambda: import_(client, [chunk([1], table="frozen")]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "state_width 8" in details
    assert export(client, "frozen") == []
    import_(client, [chunk([1], table="frozen", state=b"", state_width=0)])
    np.testing.assert_array_equal(client.pull("frozen", [1]), np.full((1, DIM), 3.0, "<f4"))


def _step(client: Client) -> int:
    stats = client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    return int(stats.engine["step"])


def test_an_import_sets_the_optimizer_step(client: Client) -> None:
    client.create(spec(optimizer={"kind": "adam"}))
    reply = import_(client, [chunk([1], width=2 * DIM, optimizer_step=41)])
    assert reply.rows == 1 and _step(client) == 41
    import_(client, [chunk([], width=0, state=b"", optimizer_step=7)])  # the step alone
    assert _step(client) == 7


def test_an_inference_table_refuses_a_step(client: Client) -> None:
    client.create(spec("frozen", mode="inference"))
    bad = chunk([1], table="frozen", width=0, state=b"", optimizer_step=3)
    code, _ = failure(lambda: import_(client, [bad]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert export(client, "frozen") == []


def test_imports_are_logged_and_replayed(tmp_path: Path) -> None:
    handle = start_in_thread(data_dir=tmp_path, durability="wal")
    client = Client(handle.address)
    client.create(spec(optimizer={"kind": "adam"}))
    width = 2 * DIM
    import_(client, [chunk([1, 2, 3], width=width, optimizer_step=12)])
    import_(client, [chunk([4], state=b"", state_width=0)])
    expected = _state_before(client)
    client.close()
    handle.stop(final_checkpoint=False)  # only the log holds the imports
    handle = start_in_thread(data_dir=tmp_path, durability="wal")
    client = Client(handle.address)
    try:
        assert _state_before(client) == expected
        assert _step(client) == 12
    finally:
        client.close()
        handle.stop(final_checkpoint=False)


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_in_thread(data_dir=tmp_path, auth_token=ADMIN, read_only_token=READER)
    admin = Client(handle.address, ADMIN)
    admin.create(spec(optimizer=ADAGRAD))
    import_(admin, [chunk([1, 2])])
    admin.close()
    yield handle
    handle.stop(final_checkpoint=False)


def test_a_read_only_token_exports_but_may_not_import(guarded: ServerHandle) -> None:
    reader, admin = Client(guarded.address, READER), Client(guarded.address, ADMIN)
    try:
        before = _state_before(admin)
        assert rows_of(export(reader, with_state=True)) == before
        code, details = failure(lambda: import_(reader, [chunk([1, 5])]))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "ImportRows" in details
        assert _state_before(admin) == before
    finally:
        reader.close()
        admin.close()


def test_no_token_neither_exports_nor_imports(guarded: ServerHandle) -> None:
    stranger, admin = Client(guarded.address), Client(guarded.address, ADMIN)
    try:
        before = _state_before(admin)
        assert failure(lambda: export(stranger))[0] == grpc.StatusCode.UNAUTHENTICATED
        code, _ = failure(lambda: import_(stranger, [chunk([1, 5])]))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert _state_before(admin) == before
    finally:
        stranger.close()
        admin.close()


def test_empty_writes_replay_beside_step_records(tmp_path: Path) -> None:
    """A step record holds no values; an empty Update (adam, every shard) keeps its dim."""
    handle = start_in_thread(data_dir=tmp_path, durability="wal")
    client = Client(handle.address)
    client.create(spec(optimizer={"kind": "adam"}))
    client.update("emb", [], np.empty((0, DIM), "<f4"))
    client.update("emb", [1], np.ones((1, DIM), "<f4"))
    import_(client, [chunk([], width=0, state=b"", optimizer_step=5)])
    client.update("emb", [2], np.ones((1, DIM), "<f4"))
    expected, step = _state_before(client), _step(client)
    client.close()
    handle.stop(final_checkpoint=False)
    handle = start_in_thread(data_dir=tmp_path, durability="wal")
    client = Client(handle.address)
    try:
        assert (_state_before(client), _step(client)) == (expected, step) and step == 6
    finally:
        client.close()
        handle.stop(final_checkpoint=False)
