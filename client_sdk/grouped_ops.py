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
    """Traced fixed-size bags ([bags, ids per bag] each): the one op, [bags, sum of dims]
    (the offsets are made, and kept, by its kernel: no op per table in the graph)."""
    if group.shared:  # each table's features one after another
        features = group.ordered(features)
    ids = torch.cat([f.reshape(-1) for f in features]).to(torch.int64)
    sizes = [f.shape[1] for f in features]
    out: torch.Tensor = torch.ops.recstore.emb_pool_group(
        anchor, group.handle, ids, sizes, features[0].shape[0], torch.empty(0)
    )
    return out


def _batch(handle: str, ids: torch.Tensor, sizes: list[int], bags: int,
           weights: torch.Tensor) -> tuple[TableGroup, GroupBatch]:  # fmt: skip
    group = _group(handle)
    offsets = group.sized_offsets(bags, sizes)
    return group, GroupBatch(ids, offsets, bags * group.copies, weights)


@_op(
    "emb_pool_group",
    schema="(Tensor anchor, str group, Tensor ids, SymInt[] sizes, SymInt bags, "
    "Tensor weights) -> Tensor",
)
def emb_pool_group(
    anchor: torch.Tensor, group: str, ids: torch.Tensor, sizes: list[int], bags: int,
    weights: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Every table of ``group`` pooled into its columns of one [bags, sum of dims] float32:
    ``ids`` table by table, ``bags`` bags per table of ``sizes[t]`` ids each."""
    found, batch = _batch(group, ids, sizes, bags, weights)
    return found.pool(batch)


@emb_pool_group.register_fake
def _(anchor, group, ids, sizes, bags, weights):
    found = _group(group)
    return ids.new_empty((bags * found.copies, found.width), dtype=torch.float32)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ctx.group, ids, ctx.sizes, ctx.bags, weights = inputs
    ctx.save_for_backward(ids, weights)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
    ids, weights = ctx.saved_tensors
    emb_update_group(ctx.group, ids, ctx.sizes, ctx.bags, weights, grad)
    return None, None, None, None, None, None


emb_pool_group.register_autograd(_backward, setup_context=_setup)


@_op(
    "emb_update_group",
    effect=True,
    schema="(str group, Tensor ids, SymInt[] sizes, SymInt bags, Tensor weights, "
    "Tensor grad) -> ()",
)
def emb_update_group(
    group: str, ids: torch.Tensor, sizes: list[int], bags: int, weights: torch.Tensor,
    grad: torch.Tensor,
) -> None:  # fmt: skip
    """``emb_pool_group``'s update: each table's columns of ``grad`` through its optimizer."""
    found, batch = _batch(group, ids, sizes, bags, weights)
    found.update(batch, grad)


@emb_update_group.register_fake
def _(group, ids, sizes, bags, weights, grad):
    return None
