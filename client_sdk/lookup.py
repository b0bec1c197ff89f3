"""The autograd bridge between a batch's ids and their rows in RecStore.

Forward pulls the rows of the given keys; backward receives the gradient of
those rows and sends it to the table's optimizer (the update runs inside
``loss.backward()``, where a dense model's optimizer would run in ``step()``;
a remote update is not waited for, see ``RecStoreClient.flush``). A sparse
gradient (one entry per lookup) is summed into one row per key first, as in a
coalesced sparse gradient, so only distinct keys travel. The padding row
never receives an update, as in torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from recstore.client.client import RecStoreClient


class RecStoreRows(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        client: RecStoreClient,
        name: str,
        keys: torch.Tensor,
        unique: bool,
        padding_idx: int | None,
    ) -> torch.Tensor:
        ctx.client, ctx.name, ctx.unique, ctx.padding_idx = client, name, unique, padding_idx
        ctx.save_for_backward(keys)
        return client._for_modules.pull(name, keys, unique=unique)

    @staticmethod
    def backward(ctx: Any, grad_rows: torch.Tensor) -> tuple[None, ...]:
        (keys,) = ctx.saved_tensors
        keys, grads = gradient_rows(keys, grad_rows, ctx.padding_idx)
        if keys.numel():
            ctx.client._for_modules.apply_gradients([(ctx.name, keys, grads, ctx.unique)])
        return None, None, None, None, None, None


@dataclass(frozen=True)
class TableLookup:
    """One table's share of ``RecStoreRowsMany``."""

    name: str
    keys: torch.Tensor  # CPU int64
    unique: bool  # the caller vouches ``keys`` has no repeats
    padding_idx: int | None
    trainable: bool  # False: rows without gradient (a frozen module)


class RecStoreRowsMany(torch.autograd.Function):
    """``RecStoreRows`` of several tables: one multi-table pull, one multi-table update."""

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, client: RecStoreClient, lookups: tuple[TableLookup, ...]
    ) -> tuple[torch.Tensor, ...]:
        ctx.client, ctx.lookups = client, lookups
        ctx.set_materialize_grads(False)  # an unused output gets no gradient, hence no update
        rows = client._for_modules.pull_many([(t.name, t.keys, t.unique) for t in lookups])
        ctx.mark_non_differentiable(
            *(r for r, t in zip(rows, lookups, strict=True) if not t.trainable)
        )
        return tuple(rows)

    @staticmethod
    def backward(ctx: Any, *grad_rows: torch.Tensor | None) -> tuple[None, ...]:
        updates = []
        for lookup, grad in zip(ctx.lookups, grad_rows, strict=True):
            if grad is None or not lookup.trainable:
                continue
            keys, grads = gradient_rows(lookup.keys, grad, lookup.padding_idx)
            if keys.numel():
                updates.append((lookup.name, keys, grads, lookup.unique))
        if updates:
            ctx.client._for_modules.apply_gradients(updates)
        return None, None, None


def gradient_rows(
    keys: torch.Tensor, grad_rows: torch.Tensor, padding_idx: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, gradient rows) to send: one row per key that got a gradient, never the padding."""
    if grad_rows.is_sparse:  # one entry per lookup: sum them into one row per key (fp32)
        looked_up = grad_rows._indices()[0]
        grads = torch.zeros(len(keys), grad_rows.shape[1], dtype=torch.float32)
        grads.index_add_(0, looked_up, grad_rows._values().float())
        present = torch.zeros(len(keys), dtype=torch.bool)
        present[looked_up] = True
        if not bool(present.all()):  # a key with no entry gets no update (adam's state)
            keys, grads = keys[present], grads[present]
    else:
        grads = grad_rows
    if padding_idx is not None:
        keep = keys != padding_idx
        keys, grads = keys[keep], grads[keep]
    return keys, grads


def renormalise_(rows: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """torch's ``embedding_renorm_`` on pulled rows; the mask of rows it scaled.

    As torch does: each row's norm in the row dtype, compared and turned into a
    scale in double, the scale applied in the dtype's compute type (float for
    16-bit rows).
    """
    norms = rows.norm(p=norm_type, dim=1).double()
    changed = norms > max_norm
    if bool(changed.any()):
        scale = max_norm / (norms[changed] + 1e-7)
        compute = torch.float64 if rows.dtype == torch.float64 else torch.float32
        scaled = rows[changed].to(compute) * scale.to(compute).unsqueeze(1)
        rows[changed] = scaled.to(rows.dtype)
    return changed
