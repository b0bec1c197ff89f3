"""Bad input: a clear TypeError / InvalidArgument, and the table exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from recstore.core import InvalidArgument, TableSpec
from recstore.store import Table

DIM = 4
N = 10


def snapshot(t: Table) -> tuple[Any, ...]:
    chunks = list(t.export_chunks())
    keys = np.concatenate([c.keys for c in chunks])
    values = np.concatenate([c.values for c in chunks])
    state = np.concatenate([c.state for c in chunks])
    return keys.tolist(), values.tobytes(), state.tobytes(), t.optimizer_state(), t.size


@pytest.fixture
def table() -> Table:
    spec = TableSpec(name="t", num_embeddings=N, embedding_dim=DIM, optimizer={"kind": "adagrad"})
    t = Table(spec)
    t.update(np.arange(5, dtype=np.int64), np.ones((5, DIM), np.float32))
    return t


K = np.array([1, 2], dtype=np.int64)
V = np.ones((2, DIM), np.float32)

CASES: list[tuple[str, Callable[[Table], Any], type[Exception]]] = [
    ("keys as a list", lambda t: t.pull([1, 2]), TypeError),
    ("int32 keys", lambda t: t.pull(K.astype(np.int32)), TypeError),
    ("2-D keys", lambda t: t.pull(K.reshape(1, 2)), InvalidArgument),
    ("strided keys", lambda t: t.pull(np.arange(6, dtype=np.int64)[::2]), TypeError),
    ("torch int32 keys", lambda t: t.pull(torch.tensor([1, 2], dtype=torch.int32)), TypeError),
    ("strided torch keys", lambda t: t.pull(torch.arange(6)[::2]), TypeError),
    (
        "keys on another device",
        lambda t: t.pull(torch.empty(2, dtype=torch.int64, device="meta")),
        InvalidArgument,
    ),
    (
        "dense id == num_embeddings in pull",
        lambda t: t.pull(np.array([1, N], np.int64)),
        InvalidArgument,
    ),
    ("negative id in update", lambda t: t.update(np.array([1, -1], np.int64), V), InvalidArgument),
    ("huge id in push", lambda t: t.push(np.array([2**62, 1], np.int64), V), InvalidArgument),
    ("bad id in erase", lambda t: t.erase(np.array([0, 99], np.int64)), InvalidArgument),
    ("bad id in find", lambda t: t.find(np.array([99], np.int64)), InvalidArgument),
    (
        "bad id in import",
        lambda t: t.import_chunk(np.array([1, 99], np.int64), V, np.ones((2, DIM), np.float32)),
        InvalidArgument,
    ),
    ("float64 values", lambda t: t.push(K, V.astype(np.float64)), TypeError),
    ("float16 values for a float32 table", lambda t: t.push(K, V.astype(np.float16)), TypeError),
    (
        "values of the wrong width",
        lambda t: t.push(K, np.ones((2, DIM + 1), np.float32)),
        InvalidArgument,
    ),
    ("fewer values than keys", lambda t: t.push(K, np.ones((1, DIM), np.float32)), InvalidArgument),
    ("1-D values", lambda t: t.push(K, np.ones(2 * DIM, np.float32)), InvalidArgument),
    (
        "Fortran-ordered values",
        lambda t: t.push(K, np.asfortranarray(np.ones((2, DIM), np.float32))),
        TypeError,
    ),
    ("values as a list", lambda t: t.push(K, V.tolist()), TypeError),
    (
        "torch float64 grads",
        lambda t: t.update(K, torch.ones(2, DIM, dtype=torch.float64)),
        TypeError,
    ),
    ("transposed torch grads", lambda t: t.update(K, torch.ones(DIM, 2).t()), TypeError),
    (
        "grads of the wrong length",
        lambda t: t.update(K, np.ones((3, DIM), np.float32)),
        InvalidArgument,
    ),
    ("negative lr", lambda t: t.update(K, V, lr=-1.0), InvalidArgument),
    ("nan lr", lambda t: t.update(K, V, lr=float("nan")), InvalidArgument),
    ("read-only out", lambda t: t.pull(K, out=_read_only()), TypeError),
    (
        "out of the wrong shape",
        lambda t: t.pull(K, out=np.empty((3, DIM), np.float32)),
        InvalidArgument,
    ),
    (
        "state of the wrong width",
        lambda t: t.import_chunk(K, V, np.ones((2, 1), np.float32)),
        InvalidArgument,
    ),
    ("float16 state", lambda t: t.import_chunk(K, V, np.ones((2, DIM), np.float16)), TypeError),
    ("chunk_rows 0", lambda t: list(t.export_chunks(chunk_rows=0)), InvalidArgument),
    ("negative step", lambda t: t.load_optimizer_state({"step": -1}), InvalidArgument),
]


def _read_only() -> np.ndarray:
    out = np.empty((2, DIM), np.float32)
    out.flags.writeable = False
    return out


@pytest.mark.parametrize(("call", "error"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_and_changes_nothing(table: Table, call, error) -> None:
    before = snapshot(table)
    with pytest.raises(error) as info:
        call(table)
    assert str(info.value)  # a message saying what was wrong
    assert snapshot(table) == before


def test_invalid_argument_is_a_value_error() -> None:
    assert issubclass(InvalidArgument, ValueError)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_tables_take_their_own_dtype_only(dtype: str) -> None:
    t = Table(TableSpec(name="t", num_embeddings=N, embedding_dim=DIM, dtype=dtype))
    wrong = np.float16 if dtype == "bfloat16" else np.uint16
    with pytest.raises(TypeError):
        t.push(K, np.ones((2, DIM), wrong))
    right = np.ones((2, DIM), np.uint16 if dtype == "bfloat16" else np.float16)
    t.push(K, right)
    assert t.pull(K).dtype == right.dtype


def test_unknown_device_is_rejected() -> None:
    with pytest.raises(InvalidArgument):
        Table(TableSpec(name="t", num_embeddings=N, embedding_dim=DIM), device="tpu")
