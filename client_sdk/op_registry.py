"""How a function becomes a ``torch.ops.recstore`` op: one library fragment, one definer.

The lookups (``recstore.client.ops``), the KVClient calls (``recstore.client.kv_ops``)
and the pooled bags (``recstore.client.pooled_ops``) all define their ops here, so
none of them imports another; ``recstore.client.dispatch`` imports all three.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._library.autograd import Info, make_autograd_impl
from torch._library.effects import EffectType
from torch.library import Library, infer_schema, register_fake

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


def op(name: str, *, effect: bool = False, schema: str | None = None) -> Any:
    """Define the decorated function as ``torch.ops.recstore.<name>`` (``effect``: it changes
    tables)."""

    def define(fn: Any) -> _Op:
        op = _Op(name, fn, schema)
        if effect:  # changes tables: never dropped, never reordered
            torch.library._register_effectful_op(op.name, EffectType.ORDERED)
        return op

    return define


def rows_like(ids: torch.Tensor, table: str) -> torch.Tensor:
    """An empty [len(ids), dim] tensor of ``table``'s layout: a lookup's fake output."""
    dim, dtype = layout(table)
    return ids.new_empty((ids.numel(), dim), dtype=dtype)
