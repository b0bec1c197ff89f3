"""``torch.ops.recstore``: the data path of ``recstore.nn`` as torch custom ops.

``torch.compile`` and ``torch.export`` trace a model with fake tensors (shapes
only); a Python call into the native engine or a gRPC stub cannot take those.
Each op here has a real kernel (``recstore.client.lookup`` or the client), a
fake kernel giving its output shape from its inputs and the table's static
layout (rows = [number of ids, embedding_dim]), and, for the lookups, an
autograd formula whose backward sends the gradient to the table's optimizer
and returns no gradient. Dedup (data-dependent sizes) stays inside the
kernels, so traced graphs see only shapes derived from their inputs. Ops that
change tables return nothing and are registered as ordered side effects, so no
graph pass drops or reorders them. Tables are named by handle
(``recstore.client.op_tables``). The op names of the reference compute layer
are kept where they apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from recstore.client.lookup import (
    NO_PADDING,
    Gradient,
    gradients_of,
    read_rows,
    renormalise_table,
    send_gradients,
)
from recstore.client.op_registry import op as _op
from recstore.client.op_registry import rows_like as _rows_like


# -- the modules' lookups (differentiable) ------------------------------------------------
@_op("emb_lookup")
def emb_lookup(
    anchor: torch.Tensor,
    table: str,
    ids: torch.Tensor,
    padding_idx: int | None = None,
    scale_grad_by_freq: bool = False,
) -> torch.Tensor:
    """Rows [ids.numel(), dim], one per occurrence; backward updates the table.

    ``anchor`` (an empty tensor that requires grad) carries autograd.
    """
    return read_rows([table], [ids])[0]


@emb_lookup.register_fake
def _(anchor, table, ids, padding_idx=None, scale_grad_by_freq=False):
    return _rows_like(ids, table)


def _lookup_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ctx.table, ids, ctx.padding_idx, ctx.scale_grad_by_freq = inputs
    ctx.save_for_backward(ids)


def _lookup_backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
    (ids,) = ctx.saved_tensors
    emb_update_table(ctx.table, ids, grad, ctx.padding_idx, ctx.scale_grad_by_freq)
    return None, None, None, None, None


emb_lookup.register_autograd(_lookup_backward, setup_context=_lookup_setup)


@_op(
    "emb_lookup_many",
    schema="(Tensor anchor, str[] tables, Tensor[] ids, int[] padding_idx, "
    "bool[] scale_grad_by_freq, bool[] trainable) -> Tensor[]",
)
def emb_lookup_many(
    anchor: torch.Tensor,
    tables: list[str],
    ids: list[torch.Tensor],
    padding_idx: list[int],
    scale_grad_by_freq: list[bool],
    trainable: list[bool],
) -> list[torch.Tensor]:
    """``emb_lookup`` of several tables of one client: one multi-table pull and update.

    ``padding_idx`` uses ``NO_PADDING`` for none; a table not ``trainable``
    (a frozen module) gives rows without gradient.
    """
    return read_rows(tables, ids)


@emb_lookup_many.register_fake
def _(anchor, tables, ids, padding_idx, scale_grad_by_freq, trainable):
    return [_rows_like(t, table) for table, t in zip(tables, ids, strict=True)]


def _many_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, ctx.tables, ids, ctx.padding_idx, ctx.scale_grad_by_freq, ctx.trainable = inputs
    ctx.set_materialize_grads(False)  # an unused output gets no gradient, hence no update
    ctx.mark_non_differentiable(*(r for r, t in zip(output, ctx.trainable, strict=True) if not t))
    ctx.save_for_backward(*ids)


def _many_backward(ctx: Any, grads: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
    ids = ctx.saved_tensors
    picked = gradients_of(
        ctx.tables, ids, grads, ctx.padding_idx, ctx.scale_grad_by_freq, ctx.trainable
    )
    if picked:
        emb_update_many(
            [g.handle for g in picked],
            [g.ids for g in picked],
            [g.grads for g in picked],
            [NO_PADDING if g.padding_idx is None else g.padding_idx for g in picked],
            [g.scale_grad_by_freq for g in picked],
        )
    return None, None, [None] * len(ids), None, None, None


emb_lookup_many.register_autograd(_many_backward, setup_context=_many_setup)


@_op("emb_renorm")
def emb_renorm(table: str, ids: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """``max_norm``: rescale the stored rows of ``ids``; returns ``ids`` (a copy) so the
    lookup that uses them comes after."""
    renormalise_table(table, ids, max_norm, norm_type)
    return ids.clone()


@emb_renorm.register_fake
def _(table, ids, max_norm, norm_type):
    return torch.empty_like(ids)


# -- updates (side effects) -----------------------------------------------------------------
@_op("emb_update_table", effect=True)
def emb_update_table(
    table: str,
    keys: torch.Tensor,
    grads: torch.Tensor,
    padding_idx: int | None = None,
    scale_grad_by_freq: bool = False,
) -> None:
    """Send gradient rows (one per key, repeats summed) to the table's optimizer."""
    send_gradients([Gradient(table, keys, grads, padding_idx, scale_grad_by_freq)])


@emb_update_table.register_fake
def _(table, keys, grads, padding_idx=None, scale_grad_by_freq=False):
    return None


@_op(
    "emb_update_many",
    effect=True,
    schema="(str[] tables, Tensor[] keys, Tensor[] grads, int[] padding_idx, "
    "bool[] scale_grad_by_freq) -> ()",
)
def emb_update_many(
    tables: list[str],
    keys: list[torch.Tensor],
    grads: list[torch.Tensor],
    padding_idx: list[int],
    scale_grad_by_freq: list[bool],
) -> None:
    """``emb_update_table`` of several tables of one client, as one multi-table update."""
    send_gradients(gradients_of(tables, keys, grads, padding_idx, scale_grad_by_freq))


@emb_update_many.register_fake
def _(tables, keys, grads, padding_idx, scale_grad_by_freq):
    return None
