"""Native engine vs the pure-Python oracle on random operation sequences.

Hypothesis draws a table (dense or hashed, every dtype, optimizer, initializer,
eviction policy, optional TTL) and a sequence of pulls, finds, pushes, updates,
erasures, clock advances, expirations and export/import round trips; after
every step the engine's answers, its size and its whole exported contents
must match the oracle's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recstore.core import CapacityExhausted, DType, InvalidArgument, TableSpec
from recstore.store import Table

TOLERANCE = {DType.float32: (1e-4, 1e-6), DType.float16: (2e-2, 2e-3), DType.bfloat16: (6e-2, 1e-2)}


@st.composite
def specs(draw: Any) -> tuple[TableSpec, int]:
    hashed = draw(st.booleans())
    optimizer = {
        "kind": draw(st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam"])),
        "lr": draw(st.sampled_from([0.05, 0.5])),
        "weight_decay": draw(st.sampled_from([0.0, 0.1])),
        "eps": 1e-6,
        "initial_accumulator_value": draw(st.sampled_from([0.0, 0.1])),
    }
    initializer = {
        "kind": draw(st.sampled_from(["zeros", "normal", "uniform"])),
        "seed": draw(st.integers(0, 2**40)),
        "std": 0.5,
    }
    dim = draw(st.integers(1, 5))
    dtype = draw(st.sampled_from(list(DType)))
    if hashed:
        capacity = draw(st.integers(3, 8))
        keys = {
            "mode": "hashed",
            "capacity": capacity,
            "eviction": draw(st.sampled_from(["none", "lru", "lfu", "lru", "lfu"])),
            "ttl_seconds": draw(st.sampled_from([None, 10.0])),
        }
        n, shards = 10**9, 1
    else:
        n = draw(st.integers(3, 16))
        keys, shards = {"mode": "dense"}, draw(st.sampled_from([1, 2]))
    spec = TableSpec(
        name="t",
        num_embeddings=n,
        embedding_dim=dim,
        dtype=dtype,
        keys=keys,
        optimizer=optimizer,
        initializer=initializer,
    )
    return spec, shards


OPS = st.one_of(
    st.tuples(
        st.sampled_from(["pull", "find", "push", "update", "erase"]),
        st.lists(st.integers(0, 11), min_size=1, max_size=6),
    ),
    # The same calls with one id a dense table must reject (-1, or num_embeddings).
    st.tuples(
        st.sampled_from(["pull", "find", "push", "update", "erase"]),
        st.lists(st.integers(0, 13), max_size=4).map(lambda k: [*k, -1]),
    ),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 6.0, 11.0])),
    st.tuples(st.just("expire"), st.none()),
    st.tuples(st.just("roundtrip"), st.none()),
)


def exported(table: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    chunks = list(table.export_chunks(chunk_rows=3))
    if not chunks:
        w = table.spec.optimizer.state_width(table.dim)
        return np.empty(0, np.int64), np.empty((0, table.dim)), np.empty((0, w), np.float32)
    keys = np.concatenate([c.keys for c in chunks])
    order = np.argsort(keys)
    values = np.concatenate([c.values for c in chunks])[order]
    state = np.concatenate([c.state for c in chunks])[order]
    return keys[order], values, state


def assert_same_contents(table: Table, model: Any, oracle: Any) -> None:
    keys, values, state = exported(table)
    live = model.live()
    assert keys.tolist() == sorted(live)
    rtol, atol = TOLERANCE[table.dtype]
    for i, k in enumerate(keys.tolist()):
        np.testing.assert_allclose(
            oracle.to_fp32(values[i], table.dtype),
            oracle.to_fp32(live[k].values, table.dtype),
            rtol=rtol,
            atol=atol,
        )
        np.testing.assert_allclose(state[i], live[k].state, rtol=rtol, atol=atol)


def run_both(fn_native: Any, fn_model: Any) -> tuple[Any, Any]:
    """Both succeed (results returned) or both raise the same error class."""
    try:
        expected = fn_model()
    except (InvalidArgument, CapacityExhausted) as e:
        with pytest.raises(type(e)):
            fn_native()
        return None, None
    return fn_native(), expected


def data_call(
    table: Table, model: Any, oracle: Any, op: str, keys: np.ndarray, raw: np.ndarray
) -> None:
    """One data-path call on both; their answers must agree."""
    k = keys.tolist()
    if op == "pull":
        got, want = run_both(lambda: table.pull(keys), lambda: model.pull(k))
    elif op == "find":
        got, want = run_both(lambda: table.find(keys), lambda: model.find(k))
        if got is not None:
            assert got[1].tolist() == want[1].tolist()
            got, want = got[0], want[0]
    elif op == "push":
        values = oracle.to_table_dtype(raw, table.dtype)
        got, want = run_both(lambda: table.push(keys, values), lambda: model.push(k, values))
    elif op == "update":
        got, want = run_both(lambda: table.update(keys, raw), lambda: model.update(k, raw))
    else:
        got, want = run_both(lambda: table.erase(keys), lambda: model.erase(k))
        assert got == want
        return
    if got is not None:
        rtol, atol = TOLERANCE[table.dtype]
        np.testing.assert_allclose(
            oracle.to_fp32(got, table.dtype),
            oracle.to_fp32(want, table.dtype),
            rtol=rtol,
            atol=atol,
        )


def round_trip(table: Table, model: Any, shards: int) -> Table:
    """Export every row into a fresh table; both must then export the same bytes."""
    copy = Table(table.spec, num_shards=shards, clock=lambda: model.now)
    for chunk in table.export_chunks(chunk_rows=2):
        copy.import_chunk(chunk.keys, chunk.values, chunk.state)
    copy.load_optimizer_state(table.optimizer_state())
    for a, b in zip(exported(table), exported(copy), strict=True):
        np.testing.assert_array_equal(a, b)
    return copy


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=specs(), ops=st.lists(OPS, min_size=10, max_size=40), seed=st.integers(0, 2**31))
def test_random_operation_sequences_match_the_oracle(drawn, ops, seed, oracle) -> None:
    spec, shards = drawn
    rng = np.random.default_rng(seed)
    model = oracle.OracleTable(spec, num_shards=shards, now=1000.0)
    table = Table(spec, num_shards=shards, clock=lambda: model.now)
    for op, arg in ops:
        if op == "advance":
            model.now += arg
        elif op == "expire":
            assert table.expire() == model.expire()
        elif op == "roundtrip":
            copy = round_trip(table, model, shards)
            if not model.tracking:  # eviction order is not part of a checkpoint
                table = copy
        else:
            keys = np.array(arg, dtype=np.int64)
            if spec.keys.mode == "dense":
                limit = spec.num_embeddings
                keys = np.where(keys >= 0, keys % limit, -1 if rng.random() < 0.5 else limit)
            raw = rng.normal(0.0, 0.3, (len(keys), spec.embedding_dim)).astype(np.float32)
            data_call(table, model, oracle, op, keys, raw)
        assert table.size == len(model.rows)
        assert_same_contents(table, model, oracle)


@pytest.mark.parametrize("kind", ["normal", "uniform", "zeros"])
@pytest.mark.parametrize("dtype", list(DType))
def test_initial_rows_are_a_pure_function_of_key_and_seed(kind, dtype, oracle) -> None:
    spec = TableSpec(
        name="t",
        num_embeddings=1000,
        embedding_dim=7,
        dtype=dtype,
        initializer={"kind": kind, "seed": 42, "mean": 0.5, "std": 2.0, "low": -3, "high": 1},
    )
    keys = np.array([0, 5, 999, 17], dtype=np.int64)
    got = Table(spec).pull(keys)
    again = Table(spec, num_shards=2, shard_index=1).pull(keys)
    np.testing.assert_array_equal(got, again)
    want = np.stack(
        [oracle.to_table_dtype(oracle.initial_row(spec, int(k)), DType(dtype)) for k in keys]
    )
    np.testing.assert_array_equal(got, want)
    if kind != "zeros":
        other = Table(
            spec.model_copy(
                update={"initializer": spec.initializer.model_copy(update={"seed": 43})}
            )
        ).pull(keys)
        assert not np.array_equal(got, other)


def test_normal_initializer_has_the_requested_moments() -> None:
    spec = TableSpec(
        name="t",
        num_embeddings=20000,
        embedding_dim=16,
        initializer={"kind": "normal", "mean": 1.0, "std": 0.5},
    )
    rows = Table(spec).pull(np.arange(20000, dtype=np.int64))
    assert abs(rows.mean() - 1.0) < 0.01
    assert abs(rows.std() - 0.5) < 0.01
