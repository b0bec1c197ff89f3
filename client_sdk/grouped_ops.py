"""A collection's grouped step (``recstore.client.grouped``) in autograd and in graphs.

Eagerly ``pool_group`` applies ``_GroupPool`` / ``_GroupPoolMany``, whose
forward is the group's one pooling call and whose backward is its one update
call (a table whose output got no gradient, as torch leaves a parameter
without one, is left as it is). Traced (``torch.compile``, ``torch.export``),
a collection of fixed-size bags is one ``torch.ops.recstore.emb_pool_group``
([bags, sum of dims] float32) and its backward one ``emb_update_group``: no
op and no graph break per table.
"""

from __future__ import annotations

import itertools
import operator
import threading
from typing import Any

import torch

from recstore.client.grouped import GroupBatch, TableGroup
from recstore.client.op_registry import op as _op

_groups: dict[str, TableGroup] = {}
_lock = threading.Lock()


def register(group: TableGroup) -> None:
    """Make ``group.handle`` name ``group`` in the ops' calls."""
    with _lock:
        _groups[group.handle] = group


def _group(handle: str) -> TableGroup:
    with _lock:
        group = _groups.get(handle)
    if group is None:
        raise RuntimeError(f"no table group is registered under {handle!r} in this process")
    return group


class _GroupPool(torch.autograd.Function):
    """Every table's bags in one output [bags, sum of dims]; backward one update."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, group: TableGroup, batch: GroupBatch) -> Any:
        out = group.pool(batch)
        ctx.group, ctx.batch = group, batch
        if group.cat_dtype != torch.float32:
            out = out.to(group.cat_dtype)
        if len(group.frozen()) == len(group.dims):
            ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
        ctx.group.update(ctx.batch, grad)
        return None, None, None


class _GroupPoolMany(torch.autograd.Function):
    """The same, one output per table (columns of one buffer, each in its table's dtype)."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, group: TableGroup, batch: GroupBatch) -> Any:
        ctx.set_materialize_grads(False)  # an unused output gets no gradient, hence no update
        ctx.group, ctx.batch = group, batch
        columns = group.pool(batch).split(group.dims, 1)
        if not group.float32:
            columns = tuple(c.to(d) for c, d in zip(columns, group.dtypes, strict=True))
        frozen = group.frozen()
        if frozen:
            ctx.mark_non_differentiable(*(columns[i] for i in frozen))
        return columns

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, ...]:
        group: TableGroup = ctx.group
        unused = list(map(operator.is_, grads, itertools.repeat(None)))  # no frame per table
        if all(unused):
            return None, None, None
        if any(unused) or not group.float32:  # else: one cat of the outputs' gradients
            rows = ctx.batch.bags
            grads = tuple(
                torch.zeros(rows, dim) if g is None else g.to(torch.float32)
                for g, dim in zip(grads, group.dims, strict=True)
            )
        grad = torch.cat(grads, 1)  # type: ignore[arg-type]
        group.update(ctx.batch, grad, skip=torch.tensor(unused) if any(unused) else None)
        return None, None, None


def pool_group(
    anchor: torch.Tensor, group: TableGroup, batch: GroupBatch, joined: bool
) -> torch.Tensor | list[torch.Tensor]:
    """Eager: one output side by side (``joined``) or one per table."""
    if joined:
        out: torch.Tensor = _GroupPool.apply(anchor, group, batch)
        return out
    return list(_GroupPoolMany.apply(anchor, group, batch))


def traced_pool_group(
    anchor: torch.Tensor, group: TableGroup, features: list[torch.Tensor]
) -> torch.Tensor:
    """Traced fixed-size bags ([bags, ids per bag] each): the one op, [bags, sum of dims]."""
    bags = features[0].shape[0]
    ids = torch.cat([f.reshape(-1) for f in features]).to(torch.int64)
    starts, base = [], 0
    for feature in features:
        size = feature.shape[1]
        starts.append(torch.arange(bags, dtype=torch.int64) * size + base)
        base = base + bags * size
    offsets = torch.cat([*starts, torch.full((1,), base, dtype=torch.int64)])
    out: torch.Tensor = torch.ops.recstore.emb_pool_group(
        anchor, group.handle, ids, offsets, bags, torch.empty(0)
    )
    return out


@_op(
    "emb_pool_group",
    schema="(Tensor anchor, str group, Tensor ids, Tensor offsets, SymInt bags, "
    "Tensor weights) -> Tensor",
)
def emb_pool_group(
    anchor: torch.Tensor, group: str, ids: torch.Tensor, offsets: torch.Tensor, bags: int,
    weights: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Every table of ``group`` pooled into its columns of one [bags, sum of dims] float32."""
    return _group(group).pool(GroupBatch(ids, offsets, bags, weights))


@emb_pool_group.register_fake
def _(anchor, group, ids, offsets, bags, weights):
    return ids.new_empty((bags, _group(group).width), dtype=torch.float32)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ctx.group, ids, offsets, ctx.bags, weights = inputs
    ctx.save_for_backward(ids, offsets, weights)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
    ids, offsets, weights = ctx.saved_tensors
    emb_update_group(ctx.group, ids, offsets, ctx.bags, weights, grad)
    return None, None, None, None, None, None


emb_pool_group.register_autograd(_backward, setup_context=_setup)


@_op(
    "emb_update_group",
    effect=True,
    schema="(str group, Tensor ids, Tensor offsets, SymInt bags, Tensor weights, "
    "Tensor grad) -> ()",
)
def emb_update_group(
    group: str, ids: torch.Tensor, offsets: torch.Tensor, bags: int, weights: torch.Tensor,
    grad: torch.Tensor,
) -> None:  # fmt: skip
    """``emb_pool_group``'s update: each table's columns of ``grad`` through its optimizer."""
    _group(group).update(GroupBatch(ids, offsets, bags, weights), grad)


@emb_update_group.register_fake
def _(group, ids, offsets, bags, weights, grad):
    return None
