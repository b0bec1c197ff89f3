"""How bags of ids become pooled rows: the one implementation every module calls.

A bag batch comes as ids and either a bag size (2-D ids: every bag that many
ids) or offsets (1-D ids: bag i starts at ``offsets[i]``). Its output is one
row per bag: the sum, mean or max of its ids' rows, optionally weighted. Three
ways of computing it exist, each for a reason, and all of them live here:

- ``pool_rows``: plain sum/mean bags from one row per occurrence (a view and a
  sum for bags of one size, ``index_add`` for bags told apart by offsets), the
  numbers the engine's own pooling gives (``Table.pool``); ``per_id_gradient``
  is its backward. ``recstore.nn`` modules and ``EmbeddingBagCollection`` pool
  with it where the engine does not (``recstore.client.pooled``).
- ``embedding_bag``: torch's own ``embedding_bag`` over the rows, for everything
  else (max, weights, padding, ``include_last_offset``), safe to trace.
- ``pool_indexed``: bags of ``rows[indices]`` (the NVE layers' distinct rows);
  fixed-size sum/mean bags of a float32 table on the CPU by the engine
  (``recstore._native.pool_distinct_bags``; its backward adds each bag's
  gradient to the rows it used in one pass), the rest by ``embedding_bag``:
  torch's op runs the same sums over its OpenMP team and sorts the indices for
  its backward, which cost a multi-table training step more CPU than its cache
  and its wire.

The tests hold every path to ``torch.nn.EmbeddingBag``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from recstore import _native as _native_module
from recstore.client.tensors import readable_rows

#: the compiled engine (no type stubs)
_native: Any = _native_module

#: ``Pool.bag_size`` of a traced 1-D batch of sum/mean bags: told apart by their offsets at
#: run time, as reading them would break the graph
SEGMENTS = -1

_MODE_NUMBER = {"sum": 0, "mean": 1, "max": 2}  # aten's embedding_bag modes


class Pool(NamedTuple):
    """How a plain bag batch becomes its output: ids per bag (or ``SEGMENTS``), mean or sum."""

    bag_size: int
    mean: bool


def bag_count(keys: torch.Tensor, offsets: torch.Tensor | None, bag_size: int) -> Any:
    """How many bags (output rows) ``keys`` make: one per offset, or per ``bag_size`` ids
    (an int, or a symbolic int while tracing)."""
    if bag_size == SEGMENTS:
        assert offsets is not None
        return offsets.shape[0]
    return keys.numel() // bag_size


def bag_starts(lookups: Any, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The offsets of bags of ``size`` ids over ``lookups`` ids: 0, size, 2 size, ..."""
    return torch.arange(0, lookups, size, dtype=dtype, device=device)


_starts: dict[tuple[Any, ...], torch.Tensor] = {}  # bag_starts already built


def uniform_bag_size(offsets: torch.Tensor, lookups: int) -> int:
    """s when ``offsets`` are 0, s, 2s, ... over ``lookups`` ids (bags of one size), else 0."""
    bags = len(offsets)
    size = lookups // bags if bags else 0
    if size == 0 or size * bags != lookups:
        return 0
    key = (bags, size, offsets.dtype, offsets.device)
    starts = _starts.get(key)
    if starts is None:
        if len(_starts) >= 16:  # a few batch shapes recur; keep only those
            _starts.clear()
        starts = bag_starts(lookups, size, offsets.dtype, offsets.device)
        _starts[key] = starts
    return size if torch.equal(offsets, starts) else 0


def _bag_of(offsets: torch.Tensor, count: int) -> torch.Tensor:
    positions = torch.arange(count, dtype=offsets.dtype, device=offsets.device)
    return torch.bucketize(positions, offsets, right=True) - 1


def _bag_sizes(offsets: torch.Tensor, count: int) -> torch.Tensor:
    end = torch.full((1,), count, dtype=offsets.dtype, device=offsets.device)
    return (torch.cat([offsets[1:], end]) - offsets).clamp(min=1).unsqueeze(1)


def pool_rows(
    rows: torch.Tensor,
    pool: Pool,
    offsets: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-occurrence ``rows`` pooled per bag (``weights``: a weighted sum), as torch does."""
    if weights is not None:
        rows = rows * weights.reshape(-1, 1)
    if pool.bag_size != SEGMENTS:
        bags = rows.view(-1, pool.bag_size, rows.shape[-1])
        return bags.mean(1) if pool.mean else bags.sum(1)
    assert offsets is not None
    count = rows.shape[0]
    out = rows.new_zeros(offsets.shape[0], rows.shape[-1]).index_add(
        0, _bag_of(offsets, count), rows
    )
    return out / _bag_sizes(offsets, count).to(out.dtype) if pool.mean else out


def per_id_gradient(
    grad: torch.Tensor, count: int, pool: Pool, offsets: torch.Tensor | None
) -> torch.Tensor:
    """``pool_rows``' backward (no weights): each occurrence's gradient row."""
    if pool.bag_size != SEGMENTS:
        per_bag = grad / pool.bag_size if pool.mean else grad
        return per_bag.repeat_interleave(pool.bag_size, 0)
    assert offsets is not None
    if pool.mean:
        grad = grad / _bag_sizes(offsets, count).to(grad.dtype)
    return grad.index_select(0, _bag_of(offsets, count))


def embedding_bag(
    index: torch.Tensor,
    rows: torch.Tensor,
    offsets: torch.Tensor | None,
    mode: str,
    per_sample_weights: torch.Tensor | None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> torch.Tensor:
    """torch's ``embedding_bag`` of ``index`` into ``rows``.

    While tracing, a padded batch goes straight to ``aten._embedding_bag``: torch's
    wrapper reads the weight's row count (here the batch's id count) as an int to
    check the padding index, which would fix that count in the graph (a compiled
    model recompiling for each batch size, an export that cannot be dynamic).
    """
    if padding_idx is None or not torch.compiler.is_compiling():
        return F.embedding_bag(
            index, rows, offsets, mode=mode, per_sample_weights=per_sample_weights,
            include_last_offset=include_last_offset, padding_idx=padding_idx,
        )  # fmt: skip
    if index.dim() == 2:  # fixed-size bags, as torch's wrapper turns them into offsets
        offsets = bag_starts(index.numel(), index.shape[1], index.dtype, index.device)
        include_last_offset = False
        index = index.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    return torch.ops.aten._embedding_bag(
        rows, index, offsets, False, _MODE_NUMBER[mode], False, per_sample_weights,
        include_last_offset, padding_idx,
    )[0]  # fmt: skip


def pool_distinct(
    rows: torch.Tensor,
    inverse: torch.Tensor,
    bag_size: int,
    mean: bool,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bags of ``bag_size`` consecutive ``inverse`` indices into distinct float32 CPU
    ``rows``, summed (or averaged) as each is read: no row per occurrence is made.
    ``out``: where they go (a column slice of a wider output will do), else a new tensor."""
    flat = inverse.contiguous().view(-1)
    if out is None:
        out = rows.new_empty((flat.numel() // bag_size, rows.shape[1]))
    _native.pool_distinct_bags(flat, rows.detach().contiguous(), bag_size, mean, out)
    return out


def unpool_distinct(
    grad: torch.Tensor, inverse: torch.Tensor, bag_size: int, mean: bool, num_rows: int
) -> torch.Tensor:
    """``pool_distinct``'s backward: each distinct row's gradient, its bags' rows summed.
    ``grad`` may be a column slice of a wider gradient (read in place, not copied)."""
    out = grad.new_empty((num_rows, grad.shape[1]))
    _native.unpool_distinct_bags(
        inverse.contiguous().view(-1), readable_rows(grad), bag_size, mean, out
    )
    return out


class _DistinctBags(torch.autograd.Function):
    """Bags of ``indices`` ([bags, bag_size]) into ``rows``, summed or averaged."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, indices: torch.Tensor, mean: bool) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.rows, ctx.bag_size, ctx.mean = rows.shape[0], indices.shape[1], mean
        return pool_distinct(rows, indices, ctx.bag_size, mean)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (indices,) = ctx.saved_tensors
        return unpool_distinct(grad, indices, ctx.bag_size, ctx.mean, ctx.rows), None, None


def _engine_pools(
    rows: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor | None,
    mode: str,
    per_sample_weights: torch.Tensor | None,
) -> bool:
    return (
        not torch.compiler.is_compiling()  # a traced program pools with torch's own op
        and offsets is None
        and per_sample_weights is None
        and mode in ("sum", "mean")
        and indices.dim() == 2
        and indices.shape[1] > 0
        and indices.dtype == torch.int64
        and rows.dtype == torch.float32
        and rows.device.type == "cpu"
        and indices.device.type == "cpu"
        and rows.dim() == 2
    )


def pool_indexed(
    rows: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor | None,
    mode: str,
    per_sample_weights: torch.Tensor | None,
) -> torch.Tensor:
    """``F.embedding_bag(indices, rows, offsets, mode=mode, per_sample_weights=...)``."""
    if _engine_pools(rows, indices, offsets, mode, per_sample_weights):
        pooled: torch.Tensor = _DistinctBags.apply(rows, indices, mode == "mean")
        return pooled
    if offsets is not None:
        offsets = offsets.to(rows.device)
    return embedding_bag(indices.to(rows.device), rows, offsets, mode, per_sample_weights)
