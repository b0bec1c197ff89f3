"""The autograd bridge between a batch's distinct ids and their rows in RecStore.

Forward pulls the rows of the distinct ids; backward receives the gradient
of those rows (sparse: one entry per lookup, which is cheaper for torch to
produce than a dense one) and sends it to the table's optimizer, repeated ids
summed as in a coalesced sparse gradient (the update runs inside ``loss.backward()``, where a dense
model's optimizer would run in ``step()``). The padding row never receives an
update, as in torch.
"""

from __future__ import annotations

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
        unique: torch.Tensor,
        padding_idx: int | None,
    ) -> torch.Tensor:
        ctx.client, ctx.name, ctx.padding_idx = client, name, padding_idx
        ctx.save_for_backward(unique)
        return client.pull(name, unique)

    @staticmethod
    def backward(ctx: Any, grad_rows: torch.Tensor) -> tuple[None, ...]:
        (unique,) = ctx.saved_tensors
        if grad_rows.is_sparse:  # one entry per lookup; the backend sums repeated keys
            keys, grads = unique[grad_rows._indices()[0]], grad_rows._values()
        else:
            keys, grads = unique, grad_rows
        if ctx.padding_idx is not None:
            keep = keys != ctx.padding_idx
            keys, grads = keys[keep], grads[keep]
        if keys.numel():
            ctx.client._apply_gradients(ctx.name, keys, grads)
        return None, None, None, None, None


def renormalise_(rows: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """torch's ``embedding_renorm_`` on pulled rows; the mask of rows it scaled."""
    norms = rows.float().norm(p=norm_type, dim=1)
    changed = norms > max_norm
    if bool(changed.any()):
        scale = (max_norm / (norms[changed] + 1e-7)).to(rows.dtype)
        rows[changed] = rows[changed] * scale.unsqueeze(1)
    return changed
