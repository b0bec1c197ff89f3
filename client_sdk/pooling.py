"""Fixed-size bags pooled in one native pass: the training fast path of ``EmbeddingBag``.

A batch of B bags of K ids is pulled as n distinct rows plus each id's
position among them. With torch ops the pooled output is a gather, a reshape
and a reduction, and the gradient back to the rows an ``index_add`` that
torch runs as a sort-based scatter (the single largest op of a remote
training step's backward). ``recstore._native.bag_pool_forward`` and
``bag_pool_backward`` do the same float32 arithmetic in one loop each. Only
the plain case comes here: float32 rows on the CPU, no gradient wanted for
per-sample weights; everything else keeps torch's ops.
"""

from __future__ import annotations

from typing import Any

import torch

from recstore import _native as _native_module

#: the compiled engine (no type stubs)
_native: Any = _native_module


def applies(rows_device: torch.device, weights: torch.Tensor | None) -> bool:
    """Whether the native pooling serves this lookup (else torch's ops do)."""
    if rows_device.type != "cpu":
        return False
    return weights is None or (weights.dtype == torch.float32 and not weights.requires_grad)


class FixedBagPool(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        rows: torch.Tensor,
        inverse: torch.Tensor,
        bag_size: int,
        weights: torch.Tensor | None,
        mean: bool,
    ) -> torch.Tensor:
        rows = rows.contiguous()
        inverse = inverse.contiguous()
        weights = None if weights is None else weights.contiguous()
        out = torch.empty(inverse.numel() // bag_size, rows.shape[1], dtype=torch.float32)
        _native.bag_pool_forward(rows, inverse, bag_size, weights, mean, out)
        ctx.save_for_backward(inverse, weights)
        ctx.shape, ctx.bag_size, ctx.mean = rows.shape, bag_size, mean
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inverse, weights = ctx.saved_tensors
        grad_out = grad_out.to(torch.float32).contiguous()
        grad_rows = torch.zeros(ctx.shape, dtype=torch.float32)
        _native.bag_pool_backward(grad_out, inverse, ctx.bag_size, weights, ctx.mean, grad_rows)
        return grad_rows, None, None, None, None


def pool_fixed_bags(
    rows: torch.Tensor,
    inverse: torch.Tensor,
    bag_size: int,
    weights: torch.Tensor | None,
    mean: bool,
) -> torch.Tensor:
    """[B, dim] pooled bags of ``rows[inverse]`` (B = len(inverse) // bag_size)."""
    flat = None if weights is None else weights.reshape(-1)
    result: torch.Tensor = FixedBagPool.apply(
        rows.to(torch.float32), inverse.reshape(-1), bag_size, flat, mean
    )
    return result
