"""NaN and infinite gradients and values: the three policies of ``nonFinite``.

reject refuses the whole batch (NonFiniteValues naming the table, the first
offending key and the count) and leaves every row, its optimizer state and the
step count exactly as they were; skip-rows leaves out every key with a
non-finite row and applies the rest, counting the keys skipped; allow writes
as given. Each case runs on every optimizer and write path against the oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from recstore.core import NonFiniteValues, TableSpec
from recstore.store import Table

DIM = 4
OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]
BAD_VALUES = [np.nan, np.inf, -np.inf]


def spec(kind: str = "adagrad", policy: str = "reject", **extra: Any) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "emb",
            "numEmbeddings": 64,
            "embeddingDim": DIM,
            "initializer": {"kind": "uniform", "low": -1.0, "high": 1.0, "seed": 3},
            "optimizer": {"kind": kind, "weightDecay": 0.01},
            "nonFinite": policy,
            **extra,
        }
    )


def snapshot(t: Table) -> tuple[Any, ...]:
    """Every resident row with its optimizer state, the step count and the size."""
    chunks = list(t.export_chunks())
    keys = np.concatenate([c.keys for c in chunks])
    order = np.argsort(keys)
    values = np.concatenate([c.values for c in chunks])[order]
    state = np.concatenate([c.state for c in chunks])[order]
    return keys[order].tolist(), values.tobytes(), state.tobytes(), t.optimizer_state(), t.size


def seeded(s: TableSpec) -> Table:
    """A table with rows 0..9 touched by one update (so there is optimizer state to keep)."""
    t = Table(s)
    rng = np.random.default_rng(1)
    t.update(np.arange(10, dtype=np.int64), rng.normal(0, 1, (10, DIM)).astype(np.float32))
    return t


def batch(bad: float, *, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Keys old and new with a repeated key; rows 2 (key 11, new) and 5 (key 4) poisoned."""
    keys = np.array([1, 3, 11, 4, 20, 4, 7], dtype=np.int64)
    rows = np.random.default_rng(seed).normal(0, 1, (len(keys), DIM)).astype(np.float32)
    rows[2, 1] = bad
    rows[5, 3] = bad
    return keys, rows


# Each write path: (name, call on the table, the same call on the oracle model).
def _update(t: Any, keys: np.ndarray, rows: np.ndarray) -> None:
    t.update(keys if isinstance(t, Table) else keys.tolist(), rows)


def _push(t: Any, keys: np.ndarray, rows: np.ndarray) -> None:
    t.push(keys if isinstance(t, Table) else keys.tolist(), rows)


def _import(t: Any, keys: np.ndarray, rows: np.ndarray) -> None:
    state = np.full((len(keys), t.spec.optimizer.state_width(DIM)), 0.5, np.float32)
    if isinstance(t, Table):
        t.import_chunk(keys, rows, state)
    else:
        t.import_rows(keys.tolist(), rows, state)


WRITES: dict[str, Callable[[Any, np.ndarray, np.ndarray], None]] = {
    "update": _update,
    "push": _push,
    "import": _import,
}
WHAT = {"update": "gradient", "push": "value", "import": "value"}


def model_of(oracle: Any, t: Table) -> Any:
    """The oracle holding exactly the table's rows (values, state, step)."""
    model = oracle.OracleTable(t.spec)
    for chunk in t.export_chunks():
        for k, v, s in zip(chunk.keys.tolist(), chunk.values, chunk.state, strict=True):
            model.rows[k] = oracle.Row(v.copy(), s.copy())
    model.step = t.optimizer_state()["step"]
    return model


def assert_same(t: Table, model: Any) -> None:
    live = model.live()
    keys = sorted(live)
    assert sorted(t._engine.keys().tolist()) == keys
    got, found = t.find(np.array(keys, dtype=np.int64))
    assert found.all()
    want = np.stack([live[k].values for k in keys])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    state = {int(k): s for c in t.export_chunks() for k, s in zip(c.keys, c.state, strict=True)}
    for k in keys:
        np.testing.assert_allclose(state[k], live[k].state, rtol=1e-6, atol=1e-7)
    assert t.optimizer_state()["step"] == model.step


@pytest.mark.parametrize("bad", BAD_VALUES, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_reject_refuses_the_whole_batch_and_changes_nothing(
    kind: str, write: str, bad: float
) -> None:
    t = seeded(spec(kind))
    before = snapshot(t)
    keys, rows = batch(bad)
    with pytest.raises(NonFiniteValues) as raised:
        WRITES[write](t, keys, rows)
    message = str(raised.value)
    assert message == (
        f"table 'emb': 2 of 7 {WHAT[write]} rows hold NaN or infinite values "
        "(the first: key 11, at position 2); nothing was applied (nonFinite: reject)"
    )
    assert raised.value.table == "emb"
    assert snapshot(t) == before  # no row created (key 11, 20), no state or step moved
    assert t.stats()["nonfinite_skipped"] == 0


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_skip_rows_leaves_out_the_poisoned_keys_and_applies_the_rest(
    oracle: Any, kind: str, write: str
) -> None:
    t = seeded(spec(kind, "skip-rows"))
    model = model_of(oracle, t)
    keys, rows = batch(np.nan)
    WRITES[write](t, keys, rows)
    WRITES[write](model, keys, rows)
    assert model.skipped == 2  # key 11 (new: never created) and key 4 (both its rows go)
    assert t.stats()["nonfinite_skipped"] == 2
    assert_same(t, model)
    assert 11 not in t._engine.keys().tolist()
    # key 4 kept its row although one of its two rows in the batch was finite
    clean = seeded(spec(kind, "skip-rows"))
    assert clean.find(np.array([4]))[0].tobytes() == t.find(np.array([4]))[0].tobytes()


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_allow_writes_as_given(oracle: Any, kind: str, write: str) -> None:
    t = seeded(spec(kind, "allow"))
    model = model_of(oracle, t)
    keys, rows = batch(np.nan)
    WRITES[write](t, keys, rows)
    WRITES[write](model, keys, rows)
    got, _ = t.find(np.array([11, 4], dtype=np.int64))
    assert np.isnan(got).any(axis=1).all()  # today's behaviour: the rows are poisoned
    live = model.live()
    np.testing.assert_array_equal(
        np.isnan(got), np.isnan(np.stack([live[11].values, live[4].values]))
    )
    assert t.stats()["nonfinite_skipped"] == 0


@pytest.mark.parametrize("policy", ["reject", "skip-rows"])
def test_finite_batches_apply_as_before_under_every_policy(oracle: Any, policy: str) -> None:
    t = seeded(spec("adam", policy))
    model = model_of(oracle, t)
    keys, rows = batch(0.25)
    t.update(keys, rows)
    model.update(keys.tolist(), rows)
    assert_same(t, model)
    assert t.stats()["nonfinite_skipped"] == 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("grads_in", ["float32", "table"])
def test_half_precision_rows_and_gradients_are_screened(
    oracle: Any, dtype: str, grads_in: str
) -> None:
    t = seeded(spec("sgd", dtype=dtype))
    before = snapshot(t)
    keys = np.array([2, 5], dtype=np.int64)
    grads = np.array([[0.5] * DIM, [0.5, np.inf, 0.5, 0.5]], dtype=np.float32)
    if grads_in == "table":
        grads = oracle.to_table_dtype(grads, t.dtype)
    with pytest.raises(NonFiniteValues, match=r"1 of 2 gradient rows .* key 5, at position 1"):
        t.update(keys, grads)
    values = oracle.to_table_dtype(np.array([[0.5] * DIM, [0.5, 0.5, np.nan, 0.5]]), t.dtype)
    with pytest.raises(NonFiniteValues, match=r"1 of 2 value rows"):
        t.push(keys, values)
    assert snapshot(t) == before


def test_hashed_tables_and_many_threads_find_the_first_offender() -> None:
    """A batch large enough to be split over threads still names the smallest position."""
    s = spec("adagrad", keys={"mode": "hashed", "capacity": 1 << 16})
    t = Table(s.model_copy(update={"num_embeddings": 1 << 16}))
    n = 40_000
    keys = np.arange(n, dtype=np.int64) * 7919
    grads = np.ones((n, DIM), np.float32)
    for position in (39_000, 21_000, 30_123):
        grads[position, 2] = np.nan
    with pytest.raises(NonFiniteValues, match=r"3 of 40000 .* key 166299000, at position 21000"):
        t.update(keys, grads)
    assert t.size == 0


def test_an_id_out_of_range_is_named_before_non_finite_values() -> None:
    from recstore.core import InvalidArgument

    t = seeded(spec())
    keys = np.array([1, 64], dtype=np.int64)
    grads = np.full((2, DIM), np.nan, np.float32)
    with pytest.raises(InvalidArgument, match="id 64 at position 1 is outside") as raised:
        t.update(keys, grads)
    assert not isinstance(raised.value, NonFiniteValues)
