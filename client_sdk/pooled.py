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
would give.

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
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from recstore.client.lookup import Gradient, flat_keys, read_rows, send_gradients
from recstore.client.op_tables import resolve, writable

if TYPE_CHECKING:
    from recstore.client.client import RecStoreClient

#: ``Pool.bag_size`` of a traced 1-D batch of sum/mean bags: told apart by their offsets at
#: run time, as reading them would break the graph
SEGMENTS = -1


class Pool(NamedTuple):
    """How a plain bag batch becomes its output: ids per bag (or ``SEGMENTS``), mean or sum."""

    bag_size: int
    mean: bool


def pools_in_engine(client: RecStoreClient, table: str) -> bool:
    """Whether ``table``'s bags can be pooled by the engine (see the module docstring)."""
    return client._for_modules.pools_bags(table)


_strides: dict[tuple[Any, ...], torch.Tensor] = {}  # offsets 0, s, 2s, ... already built


def uniform_bag_size(offsets: torch.Tensor, lookups: int) -> int:
    """s when ``offsets`` are 0, s, 2s, ... over ``lookups`` ids (bags of one size), else 0."""
    bags = len(offsets)
    size = lookups // bags if bags else 0
    if size == 0 or size * bags != lookups:
        return 0
    key = (bags, size, offsets.dtype, offsets.device)
    stride = _strides.get(key)
    if stride is None:
        if len(_strides) >= 16:  # a few batch shapes recur; keep only those
            _strides.clear()
        stride = torch.arange(0, lookups, size, dtype=offsets.dtype, device=offsets.device)
        _strides[key] = stride
    return size if torch.equal(offsets, stride) else 0


def _bag_of(offsets: torch.Tensor, count: int) -> torch.Tensor:
    positions = torch.arange(count, dtype=offsets.dtype, device=offsets.device)
    return torch.bucketize(positions, offsets, right=True) - 1


def _bag_sizes(offsets: torch.Tensor, count: int) -> torch.Tensor:
    end = torch.full((1,), count, dtype=offsets.dtype, device=offsets.device)
    return (torch.cat([offsets[1:], end]) - offsets).clamp(min=1).unsqueeze(1)


def pool_rows(
    rows: torch.Tensor,
    pool: Pool,
    offsets: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-occurrence ``rows`` pooled per bag (``weights``: a weighted sum), as torch does."""
    if weights is not None:
        rows = rows * weights.reshape(-1, 1)
    if pool.bag_size != SEGMENTS:
        bags = rows.view(-1, pool.bag_size, rows.shape[-1])
        return bags.mean(1) if pool.mean else bags.sum(1)
    assert offsets is not None
    count = rows.shape[0]
    out = rows.new_zeros(offsets.shape[0], rows.shape[-1]).index_add(
        0, _bag_of(offsets, count), rows
    )
    return out / _bag_sizes(offsets, count).to(out.dtype) if pool.mean else out


def _per_id_gradient(
    grad: torch.Tensor, count: int, pool: Pool, offsets: torch.Tensor | None
) -> torch.Tensor:
    """``pool_rows``' backward (no weights): each occurrence's gradient row."""
    if pool.bag_size != SEGMENTS:
        per_bag = grad / pool.bag_size if pool.mean else grad
        return per_bag.repeat_interleave(pool.bag_size, 0)
    assert offsets is not None
    if pool.mean:
        grad = grad / _bag_sizes(offsets, count).to(grad.dtype)
    return grad.index_select(0, _bag_of(offsets, count))


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
            rest.append(Gradient(handle, keys, _per_id_gradient(grad, keys.numel(), pool, offs)))
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
