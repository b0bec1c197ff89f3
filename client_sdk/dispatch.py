"""The modules' lookups: straight to the eager kernels, or through ``torch.ops`` when traced.

``torch.compile`` and ``torch.export`` need the ``torch.ops.recstore`` custom ops
(``recstore.client.ops``): shape-only kernels, ordered side effects, autograd
formulas a graph can hold. Eager training needs none of that, and the
dispatcher's cost of the custom ops (schema checks, autograd and effect
plumbing: about 55 µs for a bag's lookup and its update) is a large share of
a local step.
So an eager forward applies a ``torch.autograd.Function`` whose forward and
backward call exactly the functions the ops' kernels call
(``recstore.client.lookup``): one definition of what a lookup and its update
do, two ways in. Anything that traces (dynamo, export, a fake or proxy tensor,
any active dispatch mode) gets the ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

# importing them registers torch.ops.recstore's ops: lookups, KVClient calls, pooled bags
from recstore.client import kv_ops as _kv_ops  # noqa: F401
from recstore.client import ops as _ops  # noqa: F401
from recstore.client import pooled_ops as _pooled_ops  # noqa: F401
from recstore.client.bags import Pool
from recstore.client.lookup import (
    Gradient,
    gradients_of,
    read_rows,
    renormalise_table,
    send_gradients,
)
from recstore.client.pooled import pooled_many
from recstore.client.pooled_cat import pooled_cat


def tracing(ids: Sequence[torch.Tensor]) -> bool:
    """Whether this call is being traced (then only the custom ops will do)."""
    return (
        torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or _get_current_dispatch_mode() is not None
        or any(type(t) is not torch.Tensor for t in ids)  # fake, functional, proxy, ...
    )


class _Lookup(torch.autograd.Function):
    """Eager ``emb_lookup``: its kernel forward, ``emb_update_table``'s kernel backward."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        table: str,
        ids: torch.Tensor,
        padding_idx: int | None,
        scale_grad_by_freq: bool,
    ) -> torch.Tensor:
        ctx.table, ctx.padding_idx, ctx.scale_grad_by_freq = table, padding_idx, scale_grad_by_freq
        ctx.save_for_backward(ids)
        return read_rows([table], [ids])[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
        (ids,) = ctx.saved_tensors
        send_gradients([Gradient(ctx.table, ids, grad, ctx.padding_idx, ctx.scale_grad_by_freq)])
        return None, None, None, None, None


class _LookupMany(torch.autograd.Function):
    """Eager ``emb_lookup_many``: its kernel forward, ``emb_update_many``'s kernel backward."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        tables: list[str],
        ids: list[torch.Tensor],
        padding_idx: list[int],
        scale_grad_by_freq: list[bool],
        trainable: list[bool],
    ) -> tuple[torch.Tensor, ...]:
        ctx.tables, ctx.padding_idx = tables, padding_idx
        ctx.scale_grad_by_freq, ctx.trainable = scale_grad_by_freq, trainable
        ctx.ids = ids  # not inputs autograd tracks: held as they are
        ctx.set_materialize_grads(False)  # an unused output gets no gradient, hence no update
        rows = tuple(read_rows(tables, ids))
        ctx.mark_non_differentiable(*(r for r, t in zip(rows, trainable, strict=True) if not t))
        return rows

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, ...]:
        picked = gradients_of(
            ctx.tables, ctx.ids, grads, ctx.padding_idx, ctx.scale_grad_by_freq, ctx.trainable
        )
        if picked:
            send_gradients(picked)
        return None, None, None, None, None, None


def lookup(
    anchor: torch.Tensor,
    table: str,
    ids: torch.Tensor,
    padding_idx: int | None,
    scale_grad_by_freq: bool,
) -> torch.Tensor:
    """``torch.ops.recstore.emb_lookup``'s result, without the dispatcher when eager."""
    if tracing((ids,)):
        return torch.ops.recstore.emb_lookup(anchor, table, ids, padding_idx, scale_grad_by_freq)
    result: torch.Tensor = _Lookup.apply(anchor, table, ids, padding_idx, scale_grad_by_freq)
    return result


def lookup_many(
    anchor: torch.Tensor,
    tables: list[str],
    ids: list[torch.Tensor],
    padding_idx: list[int],
    scale_grad_by_freq: list[bool],
    trainable: list[bool],
) -> list[torch.Tensor]:
    """``torch.ops.recstore.emb_lookup_many``'s result, without the dispatcher when eager."""
    if tracing(ids):
        rows: list[torch.Tensor] = torch.ops.recstore.emb_lookup_many(
            anchor, tables, ids, padding_idx, scale_grad_by_freq, trainable
        )
        return rows
    return list(_LookupMany.apply(anchor, tables, ids, padding_idx, scale_grad_by_freq, trainable))


def pool_many(
    anchor: torch.Tensor,
    tables: list[str],
    ids: list[torch.Tensor],
    offsets: list[torch.Tensor | None],
    pools: list[Pool],
    trainable: list[bool],
) -> list[torch.Tensor]:
    """Plain bags pooled: ``torch.ops.recstore.emb_pool_many`` when traced, else its
    kernels directly (``Lookup.pooled`` tables)."""
    if tracing(ids):
        from recstore.client import pool_grouping  # imports inductor: only once tracing

        pool_grouping.register()  # before inductor compiles what is being traced
        sizes, means = [p.bag_size for p in pools], [p.mean for p in pools]
        out: list[torch.Tensor] = torch.ops.recstore.emb_pool_many(
            anchor, tables, ids, offsets, sizes, means, trainable
        )
        return out
    return pooled_many(anchor, tables, ids, offsets, pools, trainable)


def pool_cat(
    anchor: torch.Tensor,
    tables: list[str],
    ids: list[torch.Tensor],
    offsets: list[torch.Tensor | None],
    pools: list[Pool],
    trainable: list[bool],
) -> torch.Tensor:
    """``pool_many``'s outputs side by side in one tensor, each table pooled into its
    columns: ``torch.ops.recstore.emb_pool_cat`` when traced, else its kernels directly."""
    if tracing(ids):
        sizes, means = [p.bag_size for p in pools], [p.mean for p in pools]
        out: torch.Tensor = torch.ops.recstore.emb_pool_cat(
            anchor, tables, ids, offsets, sizes, means, trainable
        )
        return out
    return pooled_cat(anchor, tables, ids, offsets, pools, trainable)


def renorm(table: str, ids: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """``torch.ops.recstore.emb_renorm``: ``ids`` once their rows are renormalised."""
    if tracing((ids,)):
        result: torch.Tensor = torch.ops.recstore.emb_renorm(table, ids, max_norm, norm_type)
        return result
    renormalise_table(table, ids, max_norm, norm_type)
    return ids
