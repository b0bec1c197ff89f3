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
from torch._library.autograd import Info, make_autograd_impl
from torch._library.effects import EffectType
from torch.library import Library, infer_schema, register_fake

from recstore.client.lookup import (
    NO_PADDING,
    Gradient,
    gradients_of,
    read_rows,
    renormalise_table,
    send_gradients,
)
from recstore.client.op_tables import layout

NAMESPACE = "recstore"

#: every ``torch.ops.recstore`` op is defined in this fragment of the namespace
_LIBRARY = Library(NAMESPACE, "FRAGMENT")


#: the dispatch keys a call below autograd ends at when nothing traces it: plain tensors
_PLAIN_BACKENDS = frozenset({torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA})


class _Op:
    """One ``torch.ops.recstore`` op, defined on the dispatcher directly.

    ``torch.library.custom_op`` wraps its kernel in Python layers that run on
    every call (a dynamo-disable context, an output-aliasing check, a
    device-kernel switch): 30-50 µs per call, paid by every compiled step
    for each op in its graphs. Here the kernel is registered as it is (for
    every device: ``CompositeExplicitAutograd``), with the same fake kernels and
    autograd formulas (``torch.library.register_fake``, and torch's autograd
    kernel for ``register_autograd``). Calling the object calls the op.
    """

    def __init__(self, name: str, fn: Any, schema: str | None) -> None:
        self.name = f"{NAMESPACE}::{name}"
        self._short, self._fn = name, fn
        _LIBRARY.define(name + (schema or infer_schema(fn, mutates_args=())))
        _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        self._overload = getattr(getattr(torch.ops, NAMESPACE), name).default
        self.__doc__ = fn.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._overload(*args, **kwargs)

    def register_fake(self, fn: Any) -> Any:
        register_fake(self.name, fn, lib=_LIBRARY)
        return fn

    def register_autograd(self, backward: Any, *, setup_context: Any) -> None:
        """``torch.library.register_autograd``, save for one shortcut: a call that needs
        no gradient on plain tensors (a compiled graph at run time) goes straight to
        the kernel, not back through the dispatcher below autograd (a second
        conversion of every argument)."""
        traced = make_autograd_impl(self._overload, Info(backward, setup_context))
        kernel = self._fn

        def autograd(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if not (torch.is_grad_enabled() and torch._C._any_requires_grad(*args, **kwargs)):
                below = keyset & torch._C._after_autograd_keyset
                if below.highestPriorityTypeId() in _PLAIN_BACKENDS:
                    return kernel(*args, **kwargs)
            return traced(keyset, *args, **kwargs)

        _LIBRARY.impl(self._short, autograd, "Autograd", with_keyset=True)


def _op(name: str, *, effect: bool = False, schema: str | None = None) -> Any:
    def define(fn: Any) -> _Op:
        op = _Op(name, fn, schema)
        if effect:  # changes tables: never dropped, never reordered
            torch.library._register_effectful_op(op.name, EffectType.ORDERED)
        return op

    return define


def _rows_like(ids: torch.Tensor, table: str) -> torch.Tensor:
    dim, dtype = layout(table)
    return ids.new_empty((ids.numel(), dim), dtype=dtype)


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


# the KVClient calls at the op layer register on import of this module too
from recstore.client import kv_ops as kv_ops  # noqa: E402
from recstore.client import pooled_ops as pooled_ops  # noqa: E402
