"""Bags pooled in the engine: ``Table.pool`` and ``Table.update_bags`` against the row paths.

``pool`` must equal summing (averaging) the pulled rows of each bag and insert
missing rows as ``pull`` does; ``update_bags`` must leave a table exactly as
``update`` with one gradient row per occurrence does (the same sums, in the
same order), for every optimizer; bad input changes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from recstore.core import InvalidArgument, NonFiniteValues, TableSpec
from recstore.store import Table

ROWS, DIM, BAGS, BAG = 40, 6, 12, 4


def _table(kind: str = "sgd", **spec: Any) -> Table:
    return Table(
        TableSpec(
            name="bags",
            num_embeddings=ROWS,
            embedding_dim=DIM,
            initializer={"kind": "uniform", "low": -1.0, "high": 1.0, "seed": 11},
            optimizer={"kind": kind, "lr": 0.1},
            **spec,
        )
    )


def _ids(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, ROWS, (BAGS * BAG,), generator=g)
    ids[1] = ids[0]  # a repeat inside a bag
    ids[BAG] = ids[0]  # and across bags
    return ids


@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize("keys", ["dense", "hashed"])
def test_pool_sums_the_rows_of_each_bag(mean: bool, keys: str) -> None:
    table = _table(keys={"mode": keys, "capacity": ROWS})
    ids = _ids()
    pooled = table.pool(ids, BAG, mean)  # every row is new here: inserted like pull
    rows = table.pull(ids).view(BAGS, BAG, DIM)
    expected = rows.mean(1) if mean else rows.sum(1)
    torch.testing.assert_close(pooled, expected, atol=1e-6, rtol=0)
    assert table.size == len(torch.unique(ids))


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("scale", [1.0, 1.0 / BAG])
def test_update_bags_equals_the_per_occurrence_update(kind: str, scale: float) -> None:
    bags, rows = _table(kind), _table(kind)
    for step in range(3):
        ids = _ids(step)
        grads = torch.randn(BAGS, DIM, generator=torch.Generator().manual_seed(20 + step))
        bags.update_bags(ids, BAG, grads, scale)
        per_occurrence = grads.repeat_interleave(BAG, dim=0) * torch.tensor(scale)
        rows.update(ids, per_occurrence)
    everything = torch.arange(ROWS)
    torch.testing.assert_close(bags.pull(everything), rows.pull(everything), atol=0, rtol=0)


def test_update_bags_takes_a_column_slice_of_a_wider_gradient() -> None:
    """A bag's gradient as the slice of a concatenated output: rows strided, no copy needed."""
    sliced, copied = _table(), _table()
    ids = _ids()
    wide = torch.randn(BAGS, 3 * DIM, generator=torch.Generator().manual_seed(4))
    sliced.update_bags(ids, BAG, wide[:, DIM : 2 * DIM])
    copied.update_bags(ids, BAG, wide[:, DIM : 2 * DIM].contiguous())
    everything = torch.arange(ROWS)
    torch.testing.assert_close(sliced.pull(everything), copied.pull(everything), atol=0, rtol=0)


@pytest.mark.parametrize("mean", [False, True])
def test_pool_writes_a_column_slice_of_a_wider_output(mean: bool) -> None:
    """A table's bags pooled into its columns of a concatenated output: rows strided, the
    other columns untouched, the sums those of the rows pulled (the oracle)."""
    table = _table()
    ids = _ids()
    wide = torch.full((BAGS, 3 * DIM), 7.0)
    returned = table.pool(ids, BAG, mean, wide[:, DIM : 2 * DIM])
    rows = table.pull(ids).view(BAGS, BAG, DIM)
    expected = rows.mean(1) if mean else rows.sum(1)
    assert returned.data_ptr() == wide[:, DIM:].data_ptr()
    torch.testing.assert_close(wide[:, DIM : 2 * DIM], expected, atol=1e-6, rtol=0)
    assert bool((wide[:, :DIM] == 7.0).all()) and bool((wide[:, 2 * DIM :] == 7.0).all())


@pytest.mark.parametrize(
    ("out", "error", "message"),
    [
        (lambda: torch.zeros(BAGS, 2 * DIM)[:, ::2], InvalidArgument, "contiguous columns"),
        (lambda: torch.zeros(BAGS * DIM).as_strided((BAGS, DIM), (1, 1)), InvalidArgument,
         "overlap"),
        (lambda: torch.zeros(BAGS + 1, 2 * DIM)[:, :DIM], InvalidArgument, "shape"),
        (lambda: torch.zeros(BAGS, DIM, dtype=torch.float64), TypeError, "float32"),
    ],
)  # fmt: skip
def test_bad_pool_outputs_are_refused_and_change_nothing(out: Any, error: Any, message: str):
    table = _table()
    with pytest.raises(error, match=message):
        table.pool(_ids(), BAG, False, out())
    assert table.size == 0


def test_non_finite_bag_gradients_follow_the_policy_and_change_nothing() -> None:
    table = _table()
    ids = _ids()
    before = table.pull(torch.arange(ROWS)).clone()
    grads = torch.ones(BAGS, DIM)
    grads[3, 2] = float("nan")
    with pytest.raises(NonFiniteValues):
        table.update_bags(ids, BAG, grads)
    torch.testing.assert_close(table.pull(torch.arange(ROWS)), before, atol=0, rtol=0)
    skipping = _table(non_finite="skip-rows")
    reference = _table(non_finite="skip-rows")
    skipping.update_bags(ids, BAG, grads)
    reference.update(ids, grads.repeat_interleave(BAG, dim=0))
    everything = torch.arange(ROWS)
    torch.testing.assert_close(skipping.pull(everything), reference.pull(everything))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.pool(torch.arange(7), BAG), "fill bags"),
        (lambda t: t.update_bags(torch.arange(8), BAG, torch.zeros(3, DIM)), "shape"),
        (lambda t: t.update_bags(torch.arange(8), 0, torch.zeros(2, DIM)), "fill bags"),
        (lambda t: t.pool(torch.tensor([0, 1, 2, ROWS]), BAG), "is outside"),
    ],
)
def test_bad_bags_are_refused_and_change_nothing(call: Any, message: str) -> None:
    table = _table()
    with pytest.raises(InvalidArgument, match=message):
        call(table)
    assert table.size == 0


def test_pooling_needs_a_float32_table() -> None:
    table = _table(dtype="float16")
    with pytest.raises(InvalidArgument, match="float32"):
        table.pool(np.arange(8, dtype=np.int64), BAG)


@pytest.mark.parametrize("dim", [32, 48, 64, 128])
@pytest.mark.parametrize("mean", [False, True])
def test_pool_at_every_compiled_width_sums_like_the_rows(dim: int, mean: bool) -> None:
    """Widths 32, 64 and 128 sum in registers (a kernel per width), others in place: each
    writes only its columns of a wider output, with the sums of the pulled rows (exact:
    the same adds in the same order)."""
    spec = TableSpec(
        name="wide",
        num_embeddings=ROWS,
        embedding_dim=dim,
        initializer={"kind": "uniform", "low": -1.0, "high": 1.0, "seed": 2},
        optimizer={"kind": "sgd", "lr": 0.1},
    )
    table = Table(spec)
    ids = _ids(5)
    wide = torch.full((BAGS, 3 * dim), 7.0)
    table.pool(ids, BAG, mean, wide[:, dim : 2 * dim])
    rows = table.pull(ids).view(BAGS, BAG, dim)
    expected = rows[:, 0].clone()
    for i in range(1, BAG):
        expected += rows[:, i]
    if mean:
        expected *= torch.tensor(1.0 / BAG)
    torch.testing.assert_close(wide[:, dim : 2 * dim], expected, atol=0, rtol=0)
    assert bool((wide[:, :dim] == 7.0).all()) and bool((wide[:, 2 * dim :] == 7.0).all())
