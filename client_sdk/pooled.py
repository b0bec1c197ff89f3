"""Fixed-size bags pooled inside the engine (the eager fast path of the local backend).

The general lookup (``recstore.client.lookup``) hands the model one row per
occurrence of an id and takes one gradient row per occurrence back: for a
batch of bags most of a step is then copying rows out of the table, copying
gradients back in, and summing what are all copies of a few bag rows. For
plain bags of one size pooled by sum or mean on a float32 table of the local
backend in host memory, this path does what a fused embedding engine does:
the engine sums each bag's rows into its output as it reads them
(``Table.pool``), and backward hands it the one gradient row per bag, which it
adds into every id of the bag, per row in position order, before the
optimizer (``Table.update_bags``): the same sums the per-occurrence rows
would give. Traced graphs keep the custom ops (``recstore.client.ops``); a
remote lookup already pulls each distinct id once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from recstore.client.lookup import flat_keys
from recstore.client.op_tables import TableRef, resolve, writable

if TYPE_CHECKING:
    from recstore.client.client import RecStoreClient


class Pool(NamedTuple):
    """How a plain fixed-size bag batch becomes its output: ids per bag, mean or sum."""

    bag_size: int
    mean: bool


def pools_in_engine(client: RecStoreClient, table: str) -> bool:
    """Whether ``table``'s bags can be pooled by the engine (see the module docstring)."""
    return client._for_modules.pools_bags(table)


@dataclass(frozen=True)
class _Share:
    """One table's part of a pooled forward: what its backward needs."""

    handle: str
    keys: torch.Tensor
    pool: Pool


def _pool(ref: TableRef, keys: torch.Tensor, pool: Pool) -> torch.Tensor:
    return ref.client._for_modules.pool_bags(ref.name, keys, pool.bag_size, pool.mean)


class _PooledMany(torch.autograd.Function):
    """Pooled bags of several tables; backward sends each table its bags' gradient rows."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        handles: list[str],
        ids: list[torch.Tensor],
        pools: list[Pool],
        trainable: list[bool],
    ) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # an unused output gets no gradient, hence no update
        shares = [_Share(h, flat_keys(i), p) for h, i, p in zip(handles, ids, pools, strict=True)]
        out = [_pool(resolve(share.handle), share.keys, share.pool) for share in shares]
        ctx.shares, ctx.trainable = shares, trainable
        ctx.mark_non_differentiable(*(o for o, t in zip(out, trainable, strict=True) if not t))
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, ...]:
        for share, grad, trains in zip(ctx.shares, grads, ctx.trainable, strict=True):
            if grad is None or not trains or not share.keys.numel():
                continue
            ref = writable(share.handle)
            rows = grad.detach().to("cpu", torch.float32)
            if rows.stride(-1) != 1:  # strided rows (a column slice) will do, strided columns not
                rows = rows.contiguous()
            scale = 1.0 / share.pool.bag_size if share.pool.mean else 1.0
            ref.client._for_modules.update_bags(
                ref.name, share.keys, share.pool.bag_size, rows, scale
            )
        return None, None, None, None, None


def pooled_many(
    anchor: torch.Tensor,
    handles: list[str],
    ids: list[torch.Tensor],
    pools: list[Pool],
    trainable: list[bool],
) -> list[torch.Tensor]:
    """Each table's bags pooled per ``pools`` (eager only; ``pools_in_engine`` tables)."""
    return list(_PooledMany.apply(anchor, handles, ids, pools, trainable))
