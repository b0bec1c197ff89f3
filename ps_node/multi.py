"""MultiPull and MultiUpdate on one node: every item validated before any is applied.

A trainer with many tables would otherwise pay one RPC per table and shard on
every step; these run several tables' pulls or updates in one call. They are
all or nothing: each item goes through the checks of its single-table
counterpart (table hosted, dtype, dim, buffer lengths, lr, slot ownership) and
through the checks the engine would otherwise make half-way through the batch
(dense ids in range, room in a table that cannot evict) before the first item
runs, so a rejected request changes nothing. Updates hold the locks of all
their tables (taken in name order, so two multi-updates cannot deadlock)
while they apply and append their write-ahead log records; the caller waits
for every record to be durable before it replies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recstore.core import (
    CapacityExhausted,
    Eviction,
    InvalidArgument,
    KeyMode,
    RecStoreError,
    TableNotFound,
    WrongShard,
)
from recstore.core.wire import Buffer
from recstore.ps import codec
from recstore.ps.node import HostedTable, Node, WriteAck, check_lr, check_owned
from recstore.ps.wal import OP_UPDATE


class CarriedUpdatesApplied(RecStoreError):
    """A MultiPull failed after the updates it carried were applied: do not resend them."""


@dataclass(frozen=True)
class PullItem:
    table: str
    keys: Buffer
    values_out: np.ndarray  # the reply's payload for this item
    found_out: np.ndarray | None = None  # read-only pulls only


@dataclass(frozen=True)
class UpdateItem:
    table: str
    keys: Buffer
    grads: Buffer
    grad_dtype: str = ""
    dim: int = 0
    lr: float | None = None


@dataclass(frozen=True)
class _Checked:
    hosted: HostedTable
    keys: np.ndarray
    rows: np.ndarray | None = None  # update gradients
    grad_dtype: str = ""


def item_error(index: int, table: str, error: Exception) -> Exception:
    """``error`` with the item it is about in its message (same class, same status)."""
    where = f"item {index} (table {table!r}): {error}"
    if isinstance(error, WrongShard):
        return WrongShard(where, error.epoch)
    if isinstance(error, InvalidArgument | TableNotFound | CapacityExhausted):
        return type(error)(where)
    return error


def check_key_range(hosted: HostedTable, keys: np.ndarray) -> None:
    """Dense ids must lie in [0, num_embeddings): the engine refuses others mid-batch."""
    spec = hosted.entry.spec
    if spec.key_mode != KeyMode.dense or not len(keys):
        return
    low, high = int(keys.min()), int(keys.max())
    if low < 0 or high >= spec.num_embeddings:
        bad = low if low < 0 else high
        raise InvalidArgument(
            f"id {bad} is out of range for dense table {spec.name!r} (0..{spec.num_embeddings - 1})"
        )


def check_room(hosted: HostedTable, keys: Sequence[np.ndarray]) -> None:
    """Refuse when the rows these keys would insert do not fit in a table that cannot evict."""
    table = hosted.table
    total = sum(len(k) for k in keys)
    if hosted.entry.spec.keys.eviction != Eviction.none or table.size + total <= table.capacity:
        return  # cheap bound first: even if every key were new it fits
    distinct = np.unique(np.concatenate(keys))
    _, found = table.find(distinct)
    missing = int(len(distinct) - np.count_nonzero(found))
    if table.size + missing > table.capacity:
        raise CapacityExhausted(
            f"table {hosted.entry.spec.name!r} holds {table.size} of {table.capacity} rows; "
            f"{missing} new rows do not fit"
        )


def _check_all_room(checked: Sequence[_Checked]) -> None:
    by_table: dict[str, tuple[HostedTable, list[np.ndarray]]] = {}
    for item in checked:
        by_table.setdefault(item.hosted.entry.spec.name, (item.hosted, []))[1].append(item.keys)
    for hosted, keys in by_table.values():
        check_room(hosted, keys)


def _check_pull_keys(node: Node, table: str, keys_buffer: Buffer) -> _Checked:
    hosted = node.get(table)
    keys = codec.decode_keys(keys_buffer)
    check_owned(hosted, keys)
    check_key_range(hosted, keys)
    return _Checked(hosted, keys)


def _check_pull(node: Node, item: PullItem) -> _Checked:
    checked = _check_pull_keys(node, item.table, item.keys)
    if item.values_out.shape != (len(checked.keys), checked.hosted.dim):
        raise InvalidArgument(
            f"reply room for {item.values_out.shape} rows, {len(checked.keys)} keys"
        )
    return checked


def check_pulls(node: Node, pulls: Sequence[tuple[str, Buffer, bool]]) -> None:
    """The checks ``multi_pull`` makes before its first insert, for (table, keys, read_only).

    A MultiPull that carries updates runs these first, so a pull it would refuse
    refuses the request before any carried update is applied.
    """
    checked = []
    for index, (table, keys, _) in enumerate(pulls):
        try:
            checked.append(_check_pull_keys(node, table, keys))
        except (InvalidArgument, TableNotFound, WrongShard) as error:
            raise item_error(index, table, error) from None
    _check_all_room([c for c, pull in zip(checked, pulls, strict=True) if not pull[2]])


def _check_update(node: Node, item: UpdateItem) -> _Checked:
    hosted = node.get(item.table)
    codec.check_declared("", item.dim, hosted.dtype, hosted.dim)
    grad_dtype = codec.grad_dtype_for(item.grad_dtype, hosted.dtype)
    keys = codec.decode_keys(item.keys)
    grads = codec.decode_rows(item.grads, len(keys), hosted.dim, grad_dtype, "grads")
    check_lr(item.lr)
    check_owned(hosted, keys)
    check_key_range(hosted, keys)
    return _Checked(hosted, keys, grads, grad_dtype)


def _validate(node: Node, items: Sequence[PullItem | UpdateItem]) -> list[_Checked]:
    checked = []
    for index, item in enumerate(items):
        check = _check_pull if isinstance(item, PullItem) else _check_update
        try:
            checked.append(check(node, item))  # type: ignore[arg-type]
        except (InvalidArgument, TableNotFound, WrongShard) as error:
            raise item_error(index, item.table, error) from None
    return checked


def multi_pull(node: Node, items: Sequence[PullItem]) -> int:
    """Gather every item's rows into its ``values_out``; returns the rows in all."""
    checked = _validate(node, items)
    # Rows a pull inserts can fill a table that cannot evict: refuse before any insert.
    _check_all_room([c for c, item in zip(checked, items, strict=True) if item.found_out is None])
    for item, check in zip(items, checked, strict=True):
        if item.found_out is None:
            check.hosted.table.pull(check.keys, out=item.values_out)
        else:
            _, found = check.hosted.table.find(check.keys, out=item.values_out)
            item.found_out[:] = found
    return sum(len(c.keys) for c in checked)


def multi_update(node: Node, items: Sequence[UpdateItem]) -> list[WriteAck]:
    """Apply every item in order, all or nothing; one ack (rows, log record) per item."""
    checked = _validate(node, items)
    tables = {c.hosted.entry.spec.name: c.hosted for c in checked}
    with contextlib.ExitStack() as locks:
        for name in sorted(tables):  # one global order: multi-updates never deadlock
            locks.enter_context(tables[name].lock)
            if node.tables.get(name) is not tables[name]:  # dropped or reloaded meanwhile
                raise TableNotFound(f"table {name!r} is not hosted on this node")
        _check_all_room(checked)
        acks = []
        for item, check in zip(items, checked, strict=True):
            check.hosted.table.update(check.keys, check.rows, item.lr)
            acks.append(
                node.log_write(
                    check.hosted, OP_UPDATE, item.keys, item.grads, check.grad_dtype, item.lr
                )
            )
        return acks
