"""``recstore._native.DistinctGroup``: a group of remote tables' bags over their distinct rows.

Checked against torch per table: the distinct ids (first occurrence first) and
each position's index among them, ``torch.nn.functional.embedding_bag`` for the
pooling (sum, mean, per-sample weights, empty bags, a column slice as output)
and autograd for its gradient; bad arguments are refused before anything is
written.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from recstore import _native as _native_module

_native: Any = _native_module

DIMS = [16, 32, 8]
ROWS = [50, 3, 1000]  # table t's ids lie in [0, ROWS[t])
BAGS = 5


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Joined ids and offsets of three tables: ragged bags, an empty bag, a table
    without ids (the second), heavy duplicates."""
    g = torch.Generator().manual_seed(seed)
    sizes = [torch.randint(0, 4, (BAGS,), generator=g), torch.zeros(BAGS, dtype=torch.int64),
             torch.randint(1, 6, (BAGS,), generator=g)]  # fmt: skip
    sizes[0][2] = 0
    per_table = [torch.randint(0, max(1, rows // 10), (int(s.sum()),), generator=g)
                 for s, rows in zip(sizes, ROWS, strict=True)]  # fmt: skip
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cat(sizes).cumsum(0)])
    return torch.cat(per_table), offsets, per_table


def _group() -> Any:
    return _native.DistinctGroup(DIMS, [0] * len(DIMS), ROWS)


def _distinct(group: Any, ids: torch.Tensor, offsets: torch.Tensor) -> tuple[Any, ...]:
    n = ids.numel()
    unique, inverse = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
    starts = torch.empty(len(DIMS) + 1, dtype=torch.int64)
    group.distinct(ids, offsets, BAGS, unique, inverse, starts)
    return unique, inverse, starts.tolist()


def _blocks(starts: list[int]) -> list[tuple[int, int, int]]:
    """Each table's (first, end, dim) of its distinct rows."""
    return [(starts[t], starts[t + 1], dim) for t, dim in enumerate(DIMS)]


def test_each_tables_distinct_ids_come_in_first_occurrence_order() -> None:
    ids, offsets, per_table = _batch(1)
    unique, inverse, starts = _distinct(_group(), ids, offsets)
    at = 0
    for t, keys in enumerate(per_table):
        mine = unique[starts[t] : starts[t + 1]]
        first_seen = list(dict.fromkeys(keys.tolist()))
        assert mine.tolist() == first_seen
        assert torch.equal(mine[inverse[at : at + keys.numel()]], keys)
        at += keys.numel()
    assert starts[-1] == sum(len(set(k.tolist())) for k in per_table)


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weights"])
def test_pooling_and_its_gradient_match_torch(weighted: bool) -> None:
    ids, offsets, per_table = _batch(2)
    group = _group()
    unique, inverse, starts = _distinct(group, ids, offsets)
    g = torch.Generator().manual_seed(3)
    weights = torch.rand(ids.numel(), generator=g) if weighted else torch.empty(0)
    mean = torch.tensor([not weighted, not weighted, False])
    tables = [torch.randn(rows, dim, generator=g) for rows, dim in zip(ROWS, DIMS, strict=True)]
    rows = [tables[t][unique[starts[t] : starts[t + 1]]] for t in range(len(DIMS))]
    wide = torch.full((BAGS, sum(DIMS) + 4), 7.0)
    out = wide[:, 2 : 2 + sum(DIMS)]  # a column slice: rows strided
    group.pool(rows, inverse, offsets, BAGS, weights, mean, out)
    assert torch.equal(wide[:, :2], torch.full((BAGS, 2), 7.0))  # left alone outside
    grad = torch.randn(BAGS, sum(DIMS), generator=g)
    grads = [torch.full_like(r, 9.0) for r in rows]
    skip = torch.tensor([False, False, False])
    group.unpool(grad, inverse, offsets, BAGS, weights, mean, skip, grads)
    column = 0
    for t, keys in enumerate(per_table):
        a, b = int(offsets[t * BAGS]), int(offsets[(t + 1) * BAGS])
        leaf = tables[t].clone().requires_grad_(True)
        want = torch.nn.functional.embedding_bag(
            keys, leaf, offsets[t * BAGS : (t + 1) * BAGS] - a,
            mode="mean" if bool(mean[t]) else "sum",
            per_sample_weights=weights[a:b] if weighted else None,
        )  # fmt: skip
        columns = slice(column, column + DIMS[t])
        torch.testing.assert_close(out[:, columns], want, atol=1e-5, rtol=1e-5)
        (want * grad[:, columns]).sum().backward()
        assert leaf.grad is not None
        torch.testing.assert_close(
            grads[t], leaf.grad[unique[starts[t] : starts[t + 1]]], atol=1e-5, rtol=1e-5
        )
        column += DIMS[t]


def test_skipped_tables_are_left_alone() -> None:
    ids, offsets, _ = _batch(4)
    group = _group()
    _, inverse, starts = _distinct(group, ids, offsets)
    grads = [torch.full((b - a, dim), 9.0) for a, b, dim in _blocks(starts)]
    mean = torch.zeros(len(DIMS), dtype=torch.bool)
    skip = torch.tensor([True, False, True])
    group.unpool(torch.ones(BAGS, sum(DIMS)), inverse, offsets, BAGS, torch.empty(0), mean,
                 skip, grads)  # fmt: skip
    assert torch.equal(grads[0], torch.full_like(grads[0], 9.0))
    assert torch.equal(grads[2], torch.full_like(grads[2], 9.0))


def test_an_id_out_of_its_tables_range_is_refused_before_anything_is_written() -> None:
    ids, offsets, per_table = _batch(5)
    ids[per_table[0].numel() + 1] = ROWS[2]  # the third table's second id: one past its rows
    n = ids.numel()
    unique, inverse = torch.full((n,), -7), torch.full((n,), -7)
    starts = torch.full((len(DIMS) + 1,), -7)
    with pytest.raises(ValueError, match=r"table 2: id 1000 is out of range \[0, 1000\)"):
        _group().distinct(ids, offsets, BAGS, unique, inverse, starts)
    for written in (unique, inverse, starts):
        assert bool((written == -7).all())
    any_id = _native.DistinctGroup(DIMS, [0, 0, 0], [50, 3, 0])  # high <= low: any id
    any_id.distinct(ids, offsets, BAGS, unique, inverse, starts)


def test_bad_arguments_are_refused() -> None:
    ids, offsets, _ = _batch(6)
    group = _group()
    _, inverse, starts = _distinct(group, ids, offsets)
    rows = [torch.zeros(b - a, dim) for a, b, dim in _blocks(starts)]
    mean = torch.zeros(len(DIMS), dtype=torch.bool)
    out = torch.zeros(BAGS, sum(DIMS))
    none = torch.empty(0)
    with pytest.raises(ValueError, match="one block per table"):
        group.pool(rows[:2], inverse, offsets, BAGS, none, mean, out)
    with pytest.raises(ValueError, match="table 1 must be 32 wide"):
        group.pool([rows[0], torch.zeros(rows[1].shape[0], 4), rows[2]], inverse, offsets,
                   BAGS, none, mean, out)  # fmt: skip
    with pytest.raises(ValueError, match="out must have shape"):
        group.pool(rows, inverse, offsets, BAGS, none, mean, torch.zeros(BAGS, 3))
    short = [rows[0][:0], rows[1], rows[2]]  # table 0's indices point past its rows
    with pytest.raises(ValueError, match="table 0: bag index"):
        group.pool(short, inverse, offsets, BAGS, none, mean, out)
    swapped = offsets.clone()
    swapped[[1, 2]] = offsets[[2, 1]] if offsets[1] != offsets[2] else offsets[[1, 2]] + 99
    with pytest.raises(ValueError, match="offsets must not decrease"):
        group.pool(rows, inverse, swapped, BAGS, none, mean, out)
    with pytest.raises(ValueError, match="offsets"):
        group.pool(rows, inverse, offsets[:-1].contiguous(), BAGS, none, mean, out)
    with pytest.raises(ValueError, match="one id range per table"):
        _native.DistinctGroup(DIMS, [0], ROWS)
    with pytest.raises(ValueError, match="row widths must be >= 1"):
        _native.DistinctGroup([16, 0], [0, 0], [1, 1])


@pytest.mark.parametrize("order", ["first use", "any"])
def test_gradient_rows_are_overwritten_whatever_they_held(order: str) -> None:
    """Rows numbered by first use (as the distinct pass numbers them) are set by their
    first position; any other numbering is summed into zeroed rows: the same result."""
    inverse = torch.tensor([0, 1, 0, 2, 1, 3, 3, 2])  # 4 bags of 2
    if order == "any":
        inverse = torch.tensor([3, 1, 3, 0, 1, 2, 2, 0])
    offsets = torch.arange(0, 9, 2)
    grad = torch.randn(4, 8, generator=torch.Generator().manual_seed(11))
    group = _native.DistinctGroup([8], [0], [0])
    out = torch.full((4, 8), float("nan"))
    group.unpool(grad, inverse, offsets, 4, torch.empty(0), torch.tensor([False]),
                 torch.tensor([False]), [out])  # fmt: skip
    want = torch.zeros(4, 8).index_add_(0, inverse, grad.repeat_interleave(2, 0))
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)
    single = torch.full((4, 8), float("nan"))
    _native.unpool_distinct_bags(inverse, grad, 2, False, single)
    torch.testing.assert_close(single, want, atol=1e-6, rtol=0)
