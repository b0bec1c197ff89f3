"""Non-finite gradients and values through a PS node's gRPC API.

reject: INVALID_ARGUMENT naming the table, the first offending key and the
count, every table (rows, optimizer state, step) exactly as before, even for a
multi-table request whose other items are fine; skip-rows: the rest applied,
the skipped keys in the table stats and on /metrics; both ways a node serves
multi-table calls, and the write-ahead log replaying a skip-rows batch alike.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.ps import native_path
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, spec

INVALID = grpc.StatusCode.INVALID_ARGUMENT
KEYS = np.arange(40)


@pytest.fixture(params=["native path", "python path"])
def multi_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python path":
        monkeypatch.setattr(native_path, "APPLY_NATIVELY", False)  # the node applies
    return str(request.param)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerHandle, Client]]:
    handle = start_in_thread(data_dir=tmp_path, metrics_port=0)
    client = Client(handle.address)
    client.create(spec("adam", optimizer={"kind": "adam", "lr": 0.1}))
    client.create(spec("ada", embedding_dim=4, optimizer={"kind": "adagrad"}))
    client.create(spec("skip", optimizer={"kind": "adagrad"}, non_finite="skip-rows"))
    for name, dim in (("adam", 8), ("ada", 4), ("skip", 8)):  # rows with optimizer state
        client.update(name, [1, 2, 3], np.full((3, dim), 0.5, np.float32))
    yield handle, client
    client.close()
    handle.stop(final_checkpoint=False)


def poisoned(n: int, dim: int, at: tuple[int, ...], bad: float = np.nan) -> np.ndarray:
    rows = np.full((n, dim), 0.25, np.float32)
    for position in at:
        rows[position, dim // 2] = bad
    return rows


def snapshot(client: Client) -> dict[str, Any]:
    """Every table's rows and found flags, plus its engine counters (step, size)."""
    out: dict[str, Any] = {}
    for t in client.call("ListTables", ps_pb2.ListTablesRequest()).tables:
        values, found = client.find(t.table, KEYS)
        out[t.table] = (values.tobytes(), found.tobytes(), dict(t.engine))
    return out


def metrics(handle: ServerHandle) -> str:
    url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


def _item(table: str, keys: list[int], grads: np.ndarray) -> ps_pb2.UpdateRequest:
    return ps_pb2.UpdateRequest(
        table=table, keys=np.asarray(keys, "<i8").tobytes(), grads=grads.tobytes()
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_update_and_push_with_non_finite_rows_are_refused_whole(
    served: tuple[ServerHandle, Client], bad: float
) -> None:
    handle, client = served
    before = snapshot(client)
    with pytest.raises(grpc.RpcError) as info:
        client.update("adam", [3, 30, 31, 2], poisoned(4, 8, (1, 3), bad))
    assert info.value.code() == INVALID
    assert info.value.details() == (
        "table 'adam': 2 of 4 gradient rows hold NaN or infinite values (the first: key 30, "
        "at position 1); nothing was applied (nonFinite: reject)"
    )
    with pytest.raises(grpc.RpcError) as info:
        client.push("adam", [3, 32], poisoned(2, 8, (0,), bad))
    assert info.value.code() == INVALID
    assert "table 'adam': 1 of 2 value rows" in info.value.details()
    assert "key 3, at position 0" in info.value.details()
    assert snapshot(client) == before  # no row, no state, no step
    body = metrics(handle)
    assert 'recstore_ps_nonfinite_rejected_total{table="adam"} 2.0' in body
    assert 'recstore_ps_requests_total{code="INVALID_ARGUMENT",method="Update"} 1.0' in body


def test_a_multi_update_with_one_poisoned_item_changes_no_table(
    served: tuple[ServerHandle, Client], multi_path: str
) -> None:
    handle, client = served
    before = snapshot(client)
    items = [
        _item("adam", [4, 5], poisoned(2, 8, ())),
        _item("ada", [6, 7, 8], poisoned(3, 4, (2,))),
    ]
    for method, request in [
        ("MultiUpdate", ps_pb2.MultiUpdateRequest(items=items)),
        ("MultiPull", ps_pb2.MultiPullRequest(
            items=[ps_pb2.PullRequest(table="adam", keys=items[0].keys)], updates=items)),
    ]:  # fmt: skip
        with pytest.raises(grpc.RpcError) as info:
            client.call(method, request)
        assert info.value.code() == INVALID
        assert info.value.details() == (
            "item 1 (table 'ada'): 1 of 3 gradient rows hold NaN or infinite values (the first: "
            "key 8, at position 2); nothing was applied (nonFinite: reject)"
        )
    assert snapshot(client) == before
    assert 'recstore_ps_nonfinite_rejected_total{table="ada"} 2.0' in metrics(handle)


def test_skip_rows_applies_the_rest_and_counts_the_skipped_keys(
    served: tuple[ServerHandle, Client], multi_path: str
) -> None:
    handle, client = served
    reference = Client(handle.address)  # the same batches without the poisoned keys
    client.create(spec("clean", optimizer={"kind": "adagrad"}))
    client.update("clean", [1, 2, 3], np.full((3, 8), 0.5, np.float32))
    assert client.update("skip", [1, 9, 2, 9], poisoned(4, 8, (3,))).rows == 4
    reference.update("clean", [1, 2], poisoned(2, 8, ()))
    client.call("MultiUpdate", ps_pb2.MultiUpdateRequest(
        items=[_item("skip", [3, 10, 11], poisoned(3, 8, (1,), np.inf))]))  # fmt: skip
    reference.update("clean", [3, 11], poisoned(2, 8, ()))
    client.push("skip", [12, 13], poisoned(2, 8, (0,)))
    reference.push("clean", [13], poisoned(1, 8, ()))
    values, found = client.find("skip", KEYS)
    want_values, want_found = client.find("clean", KEYS)
    np.testing.assert_array_equal(found, want_found)  # keys 9, 10 and 12 never created
    np.testing.assert_array_equal(values, want_values)
    tables = client.call("ListTables", ps_pb2.ListTablesRequest()).tables
    assert {t.table: t.engine["nonfinite_skipped"] for t in tables}["skip"] == 3
    assert 'recstore_ps_nonfinite_rows_skipped_total{table="skip"} 3.0' in metrics(handle)
    reference.close()


def test_the_log_replays_a_skip_rows_batch_alike(tmp_path: Path) -> None:
    table = spec("skip", optimizer={"kind": "adam"}, non_finite="skip-rows")
    with start_in_thread(data_dir=tmp_path, durability="wal") as handle:
        client = Client(handle.address)
        client.create(table)
        client.create(spec("rej"))
        client.update("skip", [1, 2, 3], poisoned(3, 8, (1,)))
        with pytest.raises(grpc.RpcError):  # a refused batch is not logged either
            client.update("rej", [1], poisoned(1, 8, (0,)))
        before = client.find("skip", KEYS), client.find("rej", KEYS)
        client.close()
        handle.stop(final_checkpoint=False)
    with start_in_thread(data_dir=tmp_path, durability="wal") as handle:
        client = Client(handle.address)
        after = client.find("skip", KEYS), client.find("rej", KEYS)
        for (v0, f0), (v1, f1) in zip(before, after, strict=True):
            np.testing.assert_array_equal(v0, v1)
            np.testing.assert_array_equal(f0, f1)
        assert after[1][1].sum() == 0
        client.close()
        handle.stop(final_checkpoint=False)
