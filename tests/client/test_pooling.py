"""Native pooling of fixed-size bags: torch's gather-and-reduce, forward and backward."""

from __future__ import annotations

import pytest
import torch

from recstore.client import pooling


def _torch_pool(
    rows: torch.Tensor, inverse: torch.Tensor, k: int, w: torch.Tensor | None, mean: bool
):
    gathered = rows.index_select(0, inverse).view(-1, k, rows.shape[1])
    if w is not None:
        gathered = gathered * w.reshape(-1, k, 1)
    return gathered.mean(1) if mean else gathered.sum(1)


@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize(
    ("bags", "bag_size", "distinct", "dim"), [(512, 4, 300, 16), (3, 1, 3, 5), (7, 6, 2, 64)]
)
def test_pooling_matches_torch_forward_and_backward(
    mean: bool, weighted: bool, bags: int, bag_size: int, distinct: int, dim: int
) -> None:
    g = torch.Generator().manual_seed(bags * 31 + dim)
    inverse = torch.randint(0, distinct, (bags * bag_size,), generator=g)
    weights = torch.rand(bags, bag_size, generator=g) if weighted else None
    rows = torch.randn(distinct, dim, generator=g, requires_grad=True)
    reference = rows.detach().clone().requires_grad_(True)
    got = pooling.pool_fixed_bags(rows, inverse, bag_size, weights, mean)
    expected = _torch_pool(reference, inverse, bag_size, weights, mean)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(bags, dim, generator=g)
    got.backward(grad)
    expected.backward(grad)
    assert rows.grad is not None and reference.grad is not None
    torch.testing.assert_close(rows.grad, reference.grad, atol=1e-5, rtol=1e-5)


def test_only_the_plain_case_is_served_natively() -> None:
    assert pooling.applies(torch.device("cpu"), None)
    assert pooling.applies(torch.device("cpu"), torch.ones(3))
    assert not pooling.applies(torch.device("cpu"), torch.ones(3, requires_grad=True))
    assert not pooling.applies(torch.device("cpu"), torch.ones(3, dtype=torch.float64))
    assert not pooling.applies(torch.device("meta"), None)
