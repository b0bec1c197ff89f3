"""Fixed-size bags pooled inside the engine (the local backend's fast path).

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
would give (``recstore.client.bags.pool_rows``, which pools them where the
engine does not).

Eagerly ``_PooledMany`` calls the engine directly. A traced graph holds
``torch.ops.recstore.emb_pool_many`` (``recstore.client.pooled_ops``), whose
kernels are ``pool_bags`` / ``send_bag_gradients`` here: they decide per call,
by ``engine_bag_sizes``, whether the engine pools (bags whose size a trace could
not see are checked against their offsets then) or per-id rows are pooled as
the eager general path does (another backend, uneven bags).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from recstore.client.bags import (
    SEGMENTS,
    Pool,
    per_id_gradient,
    pool_rows,
    uniform_bag_size,
)
from recstore.client.lookup import Gradient, flat_keys, read_rows, send_gradients
from recstore.client.op_tables import resolve, writable

if TYPE_CHECKING:
    from recstore.client.client import RecStoreClient


def pools_in_engine(client: RecStoreClient, table: str) -> bool:
    """Whether ``table``'s bags can be pooled by the engine (see the module docstring)."""
    return client._for_modules.pools_bags(table)


def engine_bag_sizes(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor | None],
    pools: Sequence[Pool],
) -> list[int]:
    """The bag size the engine pools each table's ``ids`` by, or 0 when per-id rows are
    pooled instead. Offsets several tables share (one batch's, as a model of separate
    bags passes them) are checked for one bag size once."""
    checked: dict[tuple[int, int], int] = {}  # (id of offsets, lookups) -> size
    sizes = []
    for handle, keys, offs, pool in zip(handles, ids, offsets, pools, strict=True):
        ref = resolve(handle)
        if keys.device.type != "cpu" or not pools_in_engine(ref.client, ref.name):
            sizes.append(0)
        elif pool.bag_size != SEGMENTS:
            sizes.append(pool.bag_size)
        else:
            assert offs is not None
            key = (id(offs), keys.numel())
            if key not in checked:
                checked[key] = uniform_bag_size(offs, keys.numel())
            sizes.append(checked[key])
    return sizes


def engine_pool(
    handle: str, keys: torch.Tensor, size: int, mean: bool, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The engine's pooled bags of ``keys`` (into ``out``'s rows when given: strided will do)."""
    ref = resolve(handle)
    return ref.client._for_modules.pool_bags(ref.name, keys, size, mean, out)


def _engine_update(handle: str, keys: torch.Tensor, size: int, mean: bool,
                   grad: torch.Tensor) -> None:  # fmt: skip
    if not keys.numel():
        return
    ref = writable(handle)
    rows = grad.detach().to("cpu", torch.float32)
    if rows.stride(-1) != 1:  # strided rows (a column slice) will do, strided columns not
        rows = rows.contiguous()
    scale = 1.0 / size if mean else 1.0
    ref.client._for_modules.update_bags(ref.name, keys, size, rows, scale)


def pool_bags(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor | None],
    pools: Sequence[Pool],
) -> list[torch.Tensor]:
    """Each table's bags pooled: by the engine where it applies, else from per-id rows."""
    out: list[torch.Tensor | None] = [None] * len(handles)
    rest = []
    sizes = engine_bag_sizes(handles, ids, offsets, pools)
    for i, (handle, keys, pool, size) in enumerate(zip(handles, ids, pools, sizes, strict=True)):
        if size:
            out[i] = engine_pool(handle, flat_keys(keys), size, pool.mean)
        else:
            rest.append(i)
    if rest:  # one multi-table read for the rest
        rows = read_rows([handles[i] for i in rest], [ids[i] for i in rest])
        for i, table_rows in zip(rest, rows, strict=True):
            out[i] = pool_rows(table_rows, pools[i], offsets[i])
    return out  # type: ignore[return-value]


def send_bag_gradients(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor | None],
    pools: Sequence[Pool],
    grads: Sequence[torch.Tensor],
) -> None:
    """``pool_bags``' backward: one gradient row per bag to each table's optimizer."""
    rest = []
    sizes = engine_bag_sizes(handles, ids, offsets, pools)
    for handle, keys, offs, pool, grad, size in zip(
        handles, ids, offsets, pools, grads, sizes, strict=True
    ):
        if size:
            _engine_update(handle, flat_keys(keys), size, pool.mean, grad)
        else:
            rest.append(Gradient(handle, keys, per_id_gradient(grad, keys.numel(), pool, offs)))
    if rest:
        send_gradients(rest)


@dataclass(frozen=True)
class _Share:
    """One table's part of an eager pooled forward: what its backward needs."""

    handle: str
    keys: torch.Tensor
    pool: Pool


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
        out = [engine_pool(s.handle, s.keys, s.pool.bag_size, s.pool.mean) for s in shares]
        ctx.shares, ctx.trainable = shares, trainable
        ctx.mark_non_differentiable(*(o for o, t in zip(out, trainable, strict=True) if not t))
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, ...]:
        for share, grad, trains in zip(ctx.shares, grads, ctx.trainable, strict=True):
            if grad is not None and trains:
                _engine_update(share.handle, share.keys, share.pool.bag_size, share.pool.mean,
                               grad)  # fmt: skip
        return None, None, None, None, None


def pooled_many(
    anchor: torch.Tensor,
    handles: list[str],
    ids: list[torch.Tensor],
    pools: list[Pool],
    trainable: list[bool],
) -> list[torch.Tensor]:
    """Each table's bags pooled by the engine (eager; ``pools_in_engine`` tables)."""
    return list(_PooledMany.apply(anchor, handles, ids, pools, trainable))
