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
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from recstore.client.bags import (
    SEGMENTS,
    Pool,
    per_id_gradient,
    pool_distinct,
    pool_rows,
    uniform_bag_size,
    unpool_distinct,
)
from recstore.client.lookup import Gradient, flat_keys, read_distinct, send_gradients
from recstore.client.op_tables import resolve, writable
from recstore.client.tensors import readable_rows, unique_keys

if TYPE_CHECKING:
    from recstore.client.client import RecStoreClient


def pools_in_engine(client: RecStoreClient, table: str) -> bool:
    """Whether ``table``'s bags can be pooled by the engine (see the module docstring)."""
    return client._for_modules.pools_bags(table)


def pools_eagerly(client: RecStoreClient, table: str) -> bool:
    """Whether eager bags of ``table`` take this path: the engine pools them, or its rows
    come one per distinct id (a remote table: ``pool_read`` pools bags of one size
    from them, and their gradients are summed per distinct id)."""
    return pools_in_engine(client, table) or client._for_modules.dedup_on_wire


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
    rows = readable_rows(grad.detach().to("cpu", torch.float32))
    scale = 1.0 / size if mean else 1.0
    ref.client._for_modules.update_bags(ref.name, keys, size, rows, scale)


def pool_bags(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor | None],
    pools: Sequence[Pool],
    seen: list[Distinct | None] | None = None,
) -> list[torch.Tensor]:
    """Each table's bags pooled: by the engine where it applies, else from per-id rows.
    ``seen``: gets each table's distinct keys where recorded (``pool_read``), else None."""
    out: list[torch.Tensor | None] = [None] * len(handles)
    rest = []
    sizes = engine_bag_sizes(handles, ids, offsets, pools)
    for i, (handle, keys, pool, size) in enumerate(zip(handles, ids, pools, sizes, strict=True)):
        if size:
            out[i] = engine_pool(handle, flat_keys(keys), size, pool.mean)
        else:
            rest.append(i)
    recorded: list[Distinct | None] = []
    if rest:  # one multi-table read for the rest
        read = pool_read([handles[i] for i in rest], [ids[i] for i in rest],
                         [offsets[i] for i in rest], [pools[i] for i in rest],
                         seen=recorded)  # fmt: skip
        for i, pooled in zip(rest, read, strict=True):
            out[i] = pooled
    if seen is not None:
        seen.extend(spread_seen(len(handles), rest, recorded))
    return out  # type: ignore[return-value]


def spread_seen(
    tables: int, rest: Sequence[int], recorded: Sequence[Distinct | None]
) -> list[Distinct | None]:
    """``recorded`` (of the tables ``rest``) in the places of all ``tables``."""
    full: list[Distinct | None] = [None] * tables
    for i, distinct in zip(rest, recorded, strict=True):
        full[i] = distinct
    return full


def distinct_bag_size(keys: torch.Tensor, pool: Pool, offsets: torch.Tensor | None) -> int:
    """The size of every bag of ``keys`` when they are all one size, else 0."""
    if pool.bag_size != SEGMENTS:
        return pool.bag_size
    return uniform_bag_size(offsets, keys.numel()) if offsets is not None else 0


def _pools_distinct(rows: torch.Tensor, keys: torch.Tensor, size: int) -> bool:
    """Whether bags of ``size`` are pooled natively from distinct float32 ``rows``."""
    return (
        bool(size)
        and keys.numel() > 0
        and keys.device.type == "cpu"
        and (rows.dtype == torch.float32 and rows.device.type == "cpu")
    )


def pool_read(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor | None],
    pools: Sequence[Pool],
    into: Sequence[torch.Tensor] | None = None,
    seen: list[Distinct | None] | None = None,
) -> list[torch.Tensor]:
    """Bags the engine does not pool, from one multi-table read. Where each distinct id
    travelled once (a remote table) and the bags are of one size, each bag is summed
    from the distinct rows as it is read (``pool_distinct_bags``: no row per occurrence
    is made); else from one row per occurrence (``pool_rows``). ``into``: each table's
    output (a column slice of a joined output will do), written and returned. ``seen``:
    gets each table's distinct keys where its bags were pooled from them (None where
    not), for the backward to reuse (``bag_gradient``)."""
    out = []
    read = read_distinct(handles, ids)
    for index, (keys, offs, pool, (rows, inverse, pulled)) in enumerate(
        zip(ids, offsets, pools, read, strict=True)
    ):
        target = None if into is None else into[index]
        size = distinct_bag_size(keys, pool, offs)
        used = inverse if inverse is not None and _pools_distinct(rows, keys, size) else None
        if seen is not None:
            seen.append(None if used is None else Distinct(pulled, used))
        if used is not None:
            native_target = target is None or (
                target.dtype == torch.float32 and target.device.type == "cpu"
            )
            if native_target:
                out.append(pool_distinct(rows, used, size, pool.mean, target))
                continue
            pooled = pool_distinct(rows, used, size, pool.mean)
        else:
            per_id = rows if inverse is None else rows.index_select(0, inverse)
            pooled = pool_rows(per_id.to(keys.device), pool, offs)
        out.append(pooled if target is None else target.copy_(pooled))
    return out


class Distinct(NamedTuple):
    """A table's distinct keys in a forward, and each id's place among them."""

    keys: torch.Tensor
    inverse: torch.Tensor


def bag_gradient(
    handle: str,
    keys: torch.Tensor,
    offsets: torch.Tensor | None,
    pool: Pool,
    grad: torch.Tensor,
    seen: Distinct | None = None,
) -> Gradient:
    """One table's gradient of its pooled bags. To a remote table with bags of one size:
    each distinct id's gradient summed natively from its bags' rows
    (``unpool_distinct_bags``), sent as it is; else one row per occurrence, coalesced
    when sent. ``seen``: the forward's distinct keys of these ids (``pool_read``), else
    found again."""
    size = distinct_bag_size(keys, pool, offsets)
    grad32 = grad.detach().to("cpu", torch.float32)
    if resolve(handle).client._for_modules.dedup_on_wire and _pools_distinct(grad32, keys, size):
        unique, inverse = seen if seen is not None else unique_keys(flat_keys(keys))
        rows = unpool_distinct(grad32, inverse, size, pool.mean, unique.numel())
        return Gradient(handle, unique, rows, unique=True)
    return Gradient(handle, keys, per_id_gradient(grad, keys.numel(), pool, offsets))


def send_bag_gradients(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    offsets: Sequence[torch.Tensor | None],
    pools: Sequence[Pool],
    grads: Sequence[torch.Tensor],
    seen: Sequence[Distinct | None] | None = None,
) -> None:
    """``pool_bags``' backward: one gradient row per bag to each table's optimizer.
    ``seen``: each table's distinct keys in the forward, where it recorded them."""
    rest = []
    sizes = engine_bag_sizes(handles, ids, offsets, pools)
    for index, (handle, keys, offs, pool, grad, size) in enumerate(
        zip(handles, ids, offsets, pools, grads, sizes, strict=True)
    ):
        if size:
            _engine_update(handle, flat_keys(keys), size, pool.mean, grad)
        else:
            known = None if seen is None else seen[index]
            rest.append(bag_gradient(handle, keys, offs, pool, grad, known))
    if rest:
        send_gradients(rest)


class _PooledMany(torch.autograd.Function):
    """Pooled bags of several tables (``pool_bags``); backward sends each trainable table
    its bags' gradient rows (``send_bag_gradients``)."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        handles: list[str],
        ids: list[torch.Tensor],
        offsets: list[torch.Tensor | None],
        pools: list[Pool],
        trainable: list[bool],
    ) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # an unused output gets no gradient, hence no update
        ctx.seen = []  # the distinct keys found: backward need not find them again
        out = pool_bags(handles, ids, offsets, pools, ctx.seen)
        ctx.bags = handles, ids, offsets, pools
        ctx.trainable = trainable
        ctx.mark_non_differentiable(*(o for o, t in zip(out, trainable, strict=True) if not t))
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, ...]:
        picked = [i for i, (g, t) in enumerate(zip(grads, ctx.trainable, strict=True))
                  if g is not None and t]  # fmt: skip
        if picked:
            handles, ids, offsets, pools = ([part[i] for i in picked] for part in ctx.bags)
            picked_grads = [g for i, g in enumerate(grads) if i in picked and g is not None]
            seen = [ctx.seen[i] for i in picked]
            send_bag_gradients(handles, ids, offsets, pools, picked_grads, seen)
        return None, None, None, None, None, None


def pooled_many(
    anchor: torch.Tensor,
    handles: list[str],
    ids: list[torch.Tensor],
    offsets: list[torch.Tensor | None],
    pools: list[Pool],
    trainable: list[bool],
) -> list[torch.Tensor]:
    """Each table's bags pooled (eager; ``pools_eagerly`` tables)."""
    return list(_PooledMany.apply(anchor, handles, ids, offsets, pools, trainable))
