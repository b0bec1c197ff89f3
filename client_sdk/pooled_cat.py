"""Several tables' pooled bags side by side in one output, with no concatenating copy.

A model over an ``EmbeddingBagCollection`` (a TBE-style step, DLRM's
interaction) usually joins the pooled outputs with ``torch.cat(..., dim=1)``.
That copy costs about as much as the engine's pooling of one-id bags, and its
backward is a split whose pieces the update then reads. Here the engine writes
each table's pooled rows straight into its column slice of one
[bags, sum of dims] output (``Table.pool`` takes strided rows), and backward
hands each table its column slice of the one gradient (``Table.update_bags``
reads strided rows): no cat, no split, no ``.contiguous()``. The result is
``torch.cat(pool_bags(...), dim=1)`` exactly; a table the engine does not pool
(another backend, uneven bags) is pooled from per-id rows into its columns.

Eagerly ``_PooledCat`` calls the engine directly; a traced graph holds
``torch.ops.recstore.emb_pool_cat`` (``recstore.client.pooled_ops``), whose
kernels are ``pool_bags_cat`` and ``send_cat_gradients`` here.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import Any

import torch

from recstore.client.bags import Pool, bag_count
from recstore.client.lookup import flat_keys
from recstore.client.op_tables import layout
from recstore.client.pooled import (
    Distinct,
    engine_bag_sizes,
    engine_pool,
    pool_read,
    send_bag_gradients,
    spread_seen,
)
from recstore.core import DType
from recstore.store.buffers import new_rows


def cat_layout(handles: Sequence[str]) -> tuple[list[int], torch.dtype]:
    """Each table's width in the joined output, and its dtype (torch.cat's promotion)."""
    layouts = [layout(handle) for handle in handles]
    return [dim for dim, _ in layouts], reduce(torch.promote_types, [d for _, d in layouts])


def check_same_bags(counts: Sequence[Any]) -> None:
    """Side by side, every table needs as many bags as the first (torch.cat's rule)."""
    if any(count != counts[0] for count in counts):
        raise ValueError(
            "pooled outputs joined side by side need the same number of bags for every "
            f"table, got {list(counts)}"
        )


def _output(bags: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:  # a recycled block: no fresh pages to fault in every step
        out: torch.Tensor = new_rows(bags, width, DType.float32, True, "cpu")
        return out
    return torch.empty((bags, width), dtype=dtype)


def pool_bags_cat(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor | None],
    pools: Sequence[Pool],
    seen: list[Distinct | None] | None = None,
) -> torch.Tensor:
    """``torch.cat(pool_bags(...), dim=1)``: each table's bags pooled into its columns.
    ``seen``: as ``pool_bags``'."""
    dims, dtype = cat_layout(handles)
    counts = [bag_count(k, o, p.bag_size) for k, o, p in zip(ids, offsets, pools, strict=True)]
    check_same_bags(counts)
    device = ids[0].device
    if device.type == "cpu":
        out = _output(counts[0], sum(dims), dtype)
    else:
        out = torch.empty((counts[0], sum(dims)), dtype=dtype, device=device)
    columns = out.split(dims, dim=1)
    rest = []
    sizes = engine_bag_sizes(handles, ids, offsets, pools)  # > 0: a float32 table, CPU ids
    for i, (handle, keys, pool, size) in enumerate(zip(handles, ids, pools, sizes, strict=True)):
        if size and out.device.type == "cpu":
            engine_pool(handle, flat_keys(keys), size, pool.mean, columns[i])
        else:
            rest.append(i)
    recorded: list[Distinct | None] = []
    if rest:  # one multi-table read for the rest, pooled into their columns
        pool_read([handles[i] for i in rest], [ids[i] for i in rest],
                  [offsets[i] for i in rest], [pools[i] for i in rest],
                  into=[columns[i] for i in rest], seen=recorded)  # fmt: skip
    if seen is not None:
        seen.extend(spread_seen(len(handles), rest, recorded))
    return out


def send_cat_gradients(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor | None],
    pools: Sequence[Pool],
    trainable: Sequence[bool],
    grad: torch.Tensor,
    seen: Sequence[Distinct | None] | None = None,
) -> None:
    """``pool_bags_cat``'s backward: each trainable table its columns of ``grad``
    (``seen``: the forward's distinct keys, where recorded)."""
    dims, _ = cat_layout(handles)
    columns = grad.split(dims, dim=1)  # views: rows strided, columns contiguous
    picked = [i for i, trains in enumerate(trainable) if trains]
    if picked:
        send_bag_gradients(
            [handles[i] for i in picked],
            [ids[i] for i in picked],
            [offsets[i] for i in picked],
            [pools[i] for i in picked],
            [columns[i] for i in picked],
            None if seen is None else [seen[i] for i in picked],
        )


class _PooledCat(torch.autograd.Function):
    """Eager ``emb_pool_cat`` (``pool_bags_cat``; backward ``send_cat_gradients``)."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        handles: list[str],
        ids: list[torch.Tensor],
        offsets: list[torch.Tensor | None],
        pools: list[Pool],
        trainable: list[bool],
    ) -> torch.Tensor:
        ctx.seen = []  # the distinct keys found: backward need not find them again
        out = pool_bags_cat(handles, ids, offsets, pools, ctx.seen)
        ctx.bags, ctx.trainable = (handles, ids, offsets, pools), trainable
        if not any(trainable):
            ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[None, ...]:
        if grad is not None:
            handles, ids, offsets, pools = ctx.bags
            send_cat_gradients(handles, ids, offsets, pools, ctx.trainable, grad, ctx.seen)
        return None, None, None, None, None, None


def pooled_cat(
    anchor: torch.Tensor,
    handles: list[str],
    ids: list[torch.Tensor],
    offsets: list[torch.Tensor | None],
    pools: list[Pool],
    trainable: list[bool],
) -> torch.Tensor:
    """Each table's bags pooled into its columns of one output (eager)."""
    out: torch.Tensor = _PooledCat.apply(anchor, handles, ids, offsets, pools, trainable)
    return out
