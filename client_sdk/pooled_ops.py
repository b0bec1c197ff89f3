"""``torch.ops.recstore.emb_pool_many`` / ``emb_pool_cat``: pooled bags as custom ops.

Eager forwards of plain sum/mean bags pool in the engine without the
dispatcher (``recstore.client.pooled``); ``torch.compile`` and
``torch.export`` need an op instead: a shape-only kernel (one row per bag:
``ids.numel() // bag_size``, or one per offset for bags whose size the trace
cannot read), an autograd formula whose backward is the ordered side effect
``emb_update_pooled_many`` (one gradient row per bag), and the real kernels of
``recstore.client.pooled``, which choose the engine or per-id rows per call.
``emb_pool_cat`` is the same with the tables' outputs side by side in one
tensor (``recstore.client.pooled_cat``), its backward ``emb_update_pooled_cat``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from recstore.client.bags import Pool, bag_count
from recstore.client.op_registry import op as _op
from recstore.client.op_tables import layout
from recstore.client.pooled import pool_bags, send_bag_gradients
from recstore.client.pooled_cat import cat_layout, pool_bags_cat, send_cat_gradients


def _pools(bag_size: Sequence[int], mean: Sequence[bool]) -> list[Pool]:
    return [Pool(size, m) for size, m in zip(bag_size, mean, strict=True)]


@_op(
    "emb_pool_many",
    schema="(Tensor anchor, str[] tables, Tensor[] ids, Tensor?[] offsets, int[] bag_size, "
    "bool[] mean, bool[] trainable) -> Tensor[]",
)
def emb_pool_many(
    anchor: torch.Tensor,
    tables: list[str],
    ids: list[torch.Tensor],
    offsets: list[torch.Tensor | None],
    bag_size: list[int],
    mean: list[bool],
    trainable: list[bool],
) -> list[torch.Tensor]:
    """Each table's bags pooled: ``ids`` flat, ``bag_size`` ids per bag, or ``SEGMENTS``
    (-1) with ``offsets`` (1-D, one per bag); ``mean`` or sum; a table not
    ``trainable`` (a frozen module) gives rows without gradient."""
    return pool_bags(tables, ids, offsets, _pools(bag_size, mean))


@emb_pool_many.register_fake
def _(anchor, tables, ids, offsets, bag_size, mean, trainable):
    out = []
    for table, keys, offs, size in zip(tables, ids, offsets, bag_size, strict=True):
        dim, dtype = layout(table)
        out.append(keys.new_empty((bag_count(keys, offs, size), dim), dtype=dtype))
    return out


def _save_bags(ctx: Any, ids: list[torch.Tensor], offsets: list[torch.Tensor | None]) -> None:
    """Keep a pool call's ids and offsets for its backward (a missing offsets is no tensor)."""
    ctx.has_offsets = [o is not None for o in offsets]
    ctx.save_for_backward(*ids, *(o for o in offsets if o is not None))


def _saved_bags(ctx: Any, count: int) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """The ids and offsets ``_save_bags`` kept, one of each per table."""
    saved = ctx.saved_tensors
    ids, rest = list(saved[:count]), iter(saved[count:])
    return ids, [next(rest) if has else None for has in ctx.has_offsets]


def _pool_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ctx.tables, ids, offsets, ctx.bag_size, ctx.mean, ctx.trainable = inputs
    ctx.set_materialize_grads(False)  # an unused output gets no gradient, hence no update
    ctx.mark_non_differentiable(*(r for r, t in zip(output, ctx.trainable, strict=True) if not t))
    _save_bags(ctx, ids, offsets)


def _pool_backward(ctx: Any, grads: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
    count = len(ctx.tables)
    ids, offsets = _saved_bags(ctx, count)
    picked = [i for i, g in enumerate(grads) if g is not None and ctx.trainable[i]]
    if picked:
        emb_update_pooled_many(
            [ctx.tables[i] for i in picked],
            [ids[i] for i in picked],
            [offsets[i] for i in picked],
            [grads[i] for i in picked],
            [ctx.bag_size[i] for i in picked],
            [ctx.mean[i] for i in picked],
        )
    # autograd sees a list of inputs only when every item is a tensor, else one input
    no_offsets = [None] * count if all(ctx.has_offsets) else None
    return None, None, [None] * count, no_offsets, None, None, None


emb_pool_many.register_autograd(_pool_backward, setup_context=_pool_setup)


@_op(
    "emb_update_pooled_many",
    effect=True,
    schema="(str[] tables, Tensor[] ids, Tensor?[] offsets, Tensor[] grads, int[] bag_size, "
    "bool[] mean) -> ()",
)
def emb_update_pooled_many(
    tables: list[str],
    ids: list[torch.Tensor],
    offsets: list[torch.Tensor | None],
    grads: list[torch.Tensor],
    bag_size: list[int],
    mean: list[bool],
) -> None:
    """``emb_pool_many``'s update: one gradient row per bag to each table's optimizer."""
    send_bag_gradients(tables, ids, offsets, _pools(bag_size, mean), grads)


@emb_update_pooled_many.register_fake
def _(tables, ids, offsets, grads, bag_size, mean):
    return None


@_op(
    "emb_pool_cat",
    schema="(Tensor anchor, str[] tables, Tensor[] ids, Tensor?[] offsets, int[] bag_size, "
    "bool[] mean, bool[] trainable) -> Tensor",
)
def emb_pool_cat(
    anchor: torch.Tensor,
    tables: list[str],
    ids: list[torch.Tensor],
    offsets: list[torch.Tensor | None],
    bag_size: list[int],
    mean: list[bool],
    trainable: list[bool],
) -> torch.Tensor:
    """``emb_pool_many``'s outputs side by side, [bags, sum of dims], each table pooled
    straight into its columns (``recstore.client.pooled_cat``): no concatenating copy."""
    return pool_bags_cat(tables, ids, offsets, _pools(bag_size, mean))


@emb_pool_cat.register_fake
def _(anchor, tables, ids, offsets, bag_size, mean, trainable):
    dims, dtype = cat_layout(tables)
    counts = [bag_count(k, o, s) for k, o, s in zip(ids, offsets, bag_size, strict=True)]
    for count in counts[1:]:
        torch._check(count == counts[0], lambda: "the same number of bags for every table")
    return ids[0].new_empty((counts[0], sum(dims)), dtype=dtype)


def _cat_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ctx.tables, ids, offsets, ctx.bag_size, ctx.mean, ctx.trainable = inputs
    if not any(ctx.trainable):
        ctx.mark_non_differentiable(output)
    _save_bags(ctx, ids, offsets)


def _cat_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    count = len(ctx.tables)
    ids, offsets = _saved_bags(ctx, count)
    emb_update_pooled_cat(ctx.tables, ids, offsets, grad, ctx.bag_size, ctx.mean, ctx.trainable)
    no_offsets = [None] * count if all(ctx.has_offsets) else None  # see _pool_backward
    return None, None, [None] * count, no_offsets, None, None, None


emb_pool_cat.register_autograd(_cat_backward, setup_context=_cat_setup)


@_op(
    "emb_update_pooled_cat",
    effect=True,
    schema="(str[] tables, Tensor[] ids, Tensor?[] offsets, Tensor grad, int[] bag_size, "
    "bool[] mean, bool[] trainable) -> ()",
)
def emb_update_pooled_cat(
    tables: list[str],
    ids: list[torch.Tensor],
    offsets: list[torch.Tensor | None],
    grad: torch.Tensor,
    bag_size: list[int],
    mean: list[bool],
    trainable: list[bool],
) -> None:
    """``emb_pool_cat``'s update: each trainable table the gradient's columns of its bags."""
    send_cat_gradients(tables, ids, offsets, _pools(bag_size, mean), trainable, grad)


@emb_update_pooled_cat.register_fake
def _(tables, ids, offsets, grad, bag_size, mean, trainable):
    return None
