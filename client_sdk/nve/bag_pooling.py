"""An ``NVEmbeddingBag``'s bags pooled from its lookup's distinct rows.

A layer reads each distinct key of a batch once and pools its bags from those
rows by each id's index among them. For the common input, fixed-size bags (2-D
keys, no offsets or weights) of a float32 table summed or averaged on the CPU,
the engine does it (``recstore._native.pool_distinct_bags``; its backward adds
each bag's gradient to the rows it used in one pass): ``F.embedding_bag`` runs
the same sums over torch's OpenMP team and sorts the indices for its backward,
which cost a multi-table training step more CPU than its cache and its wire.
Everything else (offsets, weights, ``max``, other dtypes or devices) goes to
``F.embedding_bag``, which is also the tests' oracle for the engine's path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from recstore import _native as _native_module

#: the compiled engine (no type stubs)
_native: Any = _native_module


class _DistinctBags(torch.autograd.Function):
    """Bags of ``indices`` ([bags, bag_size]) into ``rows``, summed or averaged."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, indices: torch.Tensor, mean: bool) -> torch.Tensor:
        flat = indices.contiguous().view(-1)
        ctx.save_for_backward(flat)
        ctx.shape, ctx.bag_size, ctx.mean = rows.shape, indices.shape[1], mean
        out = rows.new_empty((indices.shape[0], rows.shape[1]))
        _native.pool_distinct_bags(flat, rows.detach().contiguous(), ctx.bag_size, mean, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (flat,) = ctx.saved_tensors
        out = grad.new_empty(ctx.shape)
        _native.unpool_distinct_bags(flat, grad.contiguous(), ctx.bag_size, ctx.mean, out)
        return out, None, None


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


def pool_bags(
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
    return F.embedding_bag(
        indices.to(rows.device), rows, offsets, mode=mode, per_sample_weights=per_sample_weights
    )
