"""Updates that repeat a few rows many times: merged by hashing, same result as grouping.

A batch of 200k gradient rows over ~300 distinct keys takes the engine's hash
merge (few distinct keys in a large batch); it must equal the float64 sum of
every key's gradients pushed through the optimizer, give the same bits with
one thread or several, follow the non-finite policy as the exact path does,
and match the grouped path a small batch takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from recstore import _native
from recstore.core import NonFiniteValues, TableSpec
from recstore.store import Table

ROWS, DIM, BATCH, DISTINCT = 5_000, 16, 200_000, 300
LR, EPS = 0.05, 1e-8


def _table(kind: str, **options: Any) -> Table:
    spec = TableSpec(
        name="heavy",
        num_embeddings=ROWS,
        embedding_dim=DIM,
        initializer={"kind": "uniform", "low": -1.0, "high": 1.0, "seed": 3},
        optimizer={"kind": kind, "lr": LR, "eps": EPS},
        **options,
    )
    return Table(spec)


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hot = rng.choice(ROWS, DISTINCT, replace=False)
    keys = hot[np.minimum(np.floor(rng.pareto(1.05, BATCH)).astype(np.int64), DISTINCT - 1)]
    grads = rng.normal(0, 1, (BATCH, DIM)).astype(np.float32)
    return keys.astype(np.int64), grads


def _expected(kind: str, start: np.ndarray, keys: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """One optimizer step on the float64 sum of each row's gradients."""
    merged = np.zeros((ROWS, DIM))
    np.add.at(merged, keys, grads.astype(np.float64))
    rows = np.unique(keys)
    g, w = merged[rows], start[rows].astype(np.float64)
    if kind == "sgd":
        w = w - LR * g
    elif kind == "adagrad":
        w = w - LR * g / (np.sqrt(g * g) + EPS)
    else:  # rowwise_adagrad
        state = (g * g).mean(axis=1, keepdims=True)
        w = w - LR * g / (np.sqrt(state) + EPS)
    out = start.astype(np.float64).copy()
    out[rows] = w
    return out


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad"])
def test_heavy_duplicates_update_like_the_merged_gradient(kind: str) -> None:
    table = _table(kind)
    everything = np.arange(ROWS, dtype=np.int64)
    start = table.pull(everything).copy()
    keys, grads = _batch()
    assert len(np.unique(keys)) <= DISTINCT  # the batch the hash merge is for
    table.update(keys, grads)
    # the hottest row sums ~100k float32 rows: a float32 running sum is off by ~1e-4 there
    np.testing.assert_allclose(
        table.pull(everything), _expected(kind, start, keys, grads), rtol=1e-5, atol=1e-3
    )


def test_heavy_duplicates_give_the_same_bits_with_any_thread_count() -> None:
    keys, grads = _batch(seed=1)
    results = []
    before = _native.num_threads()
    try:
        for threads in (1, 2, 3):
            _native.set_num_threads(threads)
            table = _table("rowwise_adagrad")
            table.update(keys, grads)
            results.append(table.pull(np.unique(keys)))
    finally:
        _native.set_num_threads(before)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_small_batches_keep_the_grouped_sum() -> None:
    """Below the hash merge's batch size the grouped path sums in position order: same bits
    as summing each row's gradients in call order first."""
    keys, grads = _batch(seed=2)
    keys, grads = keys[:5_000], grads[:5_000]
    merged = {}
    for k, g in zip(keys.tolist(), grads, strict=True):
        merged[k] = g.copy() if k not in merged else merged[k] + g
    one_by_one, grouped = _table("sgd"), _table("sgd")
    rows = np.array(sorted(merged), dtype=np.int64)
    one_by_one.update(rows, np.stack([merged[k] for k in rows.tolist()]))
    grouped.update(keys, grads)
    np.testing.assert_array_equal(grouped.pull(rows), one_by_one.pull(rows))


def test_a_poisoned_row_in_a_heavy_batch_follows_the_policy() -> None:
    """Merged rows are screened, and a non-finite one sends the batch down the exact path:
    reject leaves the table unchanged, skip-rows leaves out exactly the poisoned key."""
    keys, grads = _batch(seed=3)
    grads[1234, 5] = np.inf
    poisoned = keys[1234]
    everything = np.arange(ROWS, dtype=np.int64)
    rejecting = _table("sgd")
    before = rejecting.pull(everything).copy()
    with pytest.raises(NonFiniteValues):
        rejecting.update(keys, grads)
    np.testing.assert_array_equal(rejecting.pull(everything), before)

    skipping = _table("sgd", non_finite="skip-rows")
    start = skipping.pull(everything).copy()
    skipping.update(keys, grads)
    kept = keys != poisoned
    expected = _expected("sgd", start, keys[kept], grads[kept])
    np.testing.assert_allclose(skipping.pull(everything), expected, rtol=1e-5, atol=1e-3)
