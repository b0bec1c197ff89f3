"""The engine's pooling of fixed-size bags from distinct rows against ``F.embedding_bag``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from recstore import _native
from recstore.client import bags as bag_pooling
from recstore.client.bags import pool_indexed


def _case(seed: int, bags: int, bag_size: int, rows: int, dim: int):
    rng = np.random.default_rng(seed)
    table = torch.from_numpy(rng.standard_normal((rows, dim)).astype(np.float32))
    indices = torch.from_numpy(rng.integers(0, rows, (bags, bag_size)))
    grad = torch.from_numpy(rng.standard_normal((bags, dim)).astype(np.float32))
    return table, indices, grad


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize(("bags", "bag_size", "rows"), [(2048, 10, 700), (3, 1, 5), (600, 4, 1)])
def test_engine_pooling_matches_embedding_bag_forward_and_backward(
    mode: str, bags: int, bag_size: int, rows: int
) -> None:
    table, indices, grad = _case(bags + rows, bags, bag_size, rows, 16)
    ours_rows = table.clone().requires_grad_()
    ours = pool_indexed(ours_rows, indices, None, mode, None)
    assert bag_pooling._engine_pools(ours_rows, indices, None, mode, None)
    ours.backward(grad)
    oracle_rows = table.clone().requires_grad_()
    oracle = F.embedding_bag(indices, oracle_rows, None, mode=mode)
    oracle.backward(grad)
    torch.testing.assert_close(ours, oracle, rtol=1e-6, atol=1e-6)
    assert ours_rows.grad is not None and oracle_rows.grad is not None
    # a row's gradient sums every bag that used it (2400 for one row): torch adds them in
    # another order, so the two round apart by a few float32 ulps of the sum
    torch.testing.assert_close(ours_rows.grad, oracle_rows.grad, rtol=1e-4, atol=1e-3)


def test_a_non_contiguous_gradient_is_pooled_back_like_torch() -> None:
    """The gradient of one table's slice of a concatenated output is a strided view."""
    table, indices, _ = _case(1, 64, 3, 40, 8)
    ours_rows, oracle_rows = table.clone().requires_grad_(), table.clone().requires_grad_()
    target = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    out = torch.cat([pool_indexed(ours_rows, indices, None, "sum", None), torch.zeros(64, 8)], 1)
    (out * target).sum().backward()
    (F.embedding_bag(indices, oracle_rows, None, mode="sum") * target[:, :8]).sum().backward()
    torch.testing.assert_close(ours_rows.grad, oracle_rows.grad)


@pytest.mark.parametrize(
    "case",
    ["offsets", "weights", "max", "bfloat16", "flat"],
)
def test_other_inputs_go_to_embedding_bag(case: str) -> None:
    table, indices, _ = _case(2, 8, 3, 10, 4)
    offsets = weights = None
    mode = "sum"
    if case == "offsets":
        indices, offsets = indices.reshape(-1), torch.tensor([0, 5, 9])
    elif case == "weights":
        weights = torch.rand(indices.shape)
    elif case == "max":
        mode = "max"
    elif case == "bfloat16":
        table = table.to(torch.bfloat16)
    else:
        indices, offsets = indices.reshape(-1), torch.arange(0, 24, 3)
    assert not bag_pooling._engine_pools(table, indices, offsets, mode, weights)
    expected = F.embedding_bag(indices, table, offsets, mode=mode, per_sample_weights=weights)
    torch.testing.assert_close(pool_indexed(table, indices, offsets, mode, weights), expected)


def test_an_index_outside_the_rows_is_refused_and_out_is_untouched() -> None:
    rows = torch.ones(4, 2)
    out = torch.full((2, 2), 7.0)
    inverse = torch.tensor([0, 1, 2, 4])
    with pytest.raises(ValueError, match=r"bag index 4 at position 3 is not in \[0, 4\)"):
        _native.pool_distinct_bags(inverse, rows, 2, False, out)
    grads = torch.full((4, 2), 7.0)
    with pytest.raises(ValueError, match="bag index 4"):
        _native.unpool_distinct_bags(inverse, torch.ones(2, 2), 2, False, grads)
    assert torch.equal(out, torch.full((2, 2), 7.0))
    assert torch.equal(grads, torch.full((4, 2), 7.0))
    with pytest.raises(ValueError, match="fill bags of bag_size"):
        _native.pool_distinct_bags(torch.tensor([0, 1, 2]), rows, 2, False, out)
    with pytest.raises(ValueError, match=r"out must have shape"):
        _native.pool_distinct_bags(inverse, rows, 2, False, torch.empty(3, 2))


def test_bags_pool_into_and_unpool_from_a_column_slice_of_a_wider_tensor() -> None:
    """Strided rows (a column slice of a joined output or of its gradient) are written and
    read in place, exactly as contiguous ones; strided columns and overlapping rows are
    refused."""
    g = torch.Generator().manual_seed(5)
    rows, inverse = torch.randn(7, 3, generator=g), torch.randint(0, 7, (12,), generator=g)
    alone = torch.empty(4, 3)
    _native.pool_distinct_bags(inverse, rows, 3, True, alone)
    wide = torch.full((4, 8), 9.0)
    _native.pool_distinct_bags(inverse, rows, 3, True, wide[:, 2:5])
    torch.testing.assert_close(wide[:, 2:5], alone, atol=0, rtol=0)
    assert torch.equal(wide[:, :2], torch.full((4, 2), 9.0))  # the other columns untouched
    assert torch.equal(wide[:, 5:], torch.full((4, 3), 9.0))
    grads = torch.randn(4, 8, generator=g)
    expected, got = torch.empty(7, 3), torch.empty(7, 3)
    _native.unpool_distinct_bags(inverse, grads[:, 2:5].contiguous(), 3, False, expected)
    _native.unpool_distinct_bags(inverse, grads[:, 2:5], 3, False, got)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match="contiguous columns"):
        _native.pool_distinct_bags(inverse, rows, 3, True, torch.empty(4, 6)[:, ::2])
    with pytest.raises(ValueError, match="must not overlap"):
        _native.unpool_distinct_bags(inverse, torch.ones(3).expand(4, 3), 3, False, got)
