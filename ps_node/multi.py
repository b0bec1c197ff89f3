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

Python's cost per numpy call outweighs the work on a few hundred keys, so
the slot ownership and dense id range of all items' keys are checked in one
pass over them together (the item-by-item checks run only to name the culprit
of a refusal, as they would have), and a pull resolved by the servicer, or
checked before the updates it carries, is not resolved or checked again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recstore.core import (
    CapacityExhausted,
    InvalidArgument,
    RecStoreError,
    TableNotFound,
    WrongShard,
    slot_of,
)
from recstore.core.wire import Buffer
from recstore.ps import codec
from recstore.ps.node import HostedTable, Node, WriteAck, check_lr, check_owned
from recstore.ps.wal import OP_UPDATE


class CarriedUpdatesApplied(RecStoreError):
    """A MultiPull failed after the updates it carried were applied: do not resend them."""


@dataclass(slots=True)
class Resolved:
    """An item's hosted table and decoded keys (and an update's gradient rows)."""

    table: str
    hosted: HostedTable
    keys: np.ndarray
    rows: np.ndarray | None = None  # update gradients
    grad_dtype: str = ""


@dataclass(slots=True)
class PullItem:
    table: str
    keys: Buffer
    values_out: np.ndarray  # the reply's payload for this item
    found_out: np.ndarray | None = None  # read-only pulls only
    #: from ``resolve_pulls``; used while its table is still the one hosted
    resolved: Resolved | None = None
    #: the resolved keys passed ``check_pulls`` (ownership and id range) already
    checked: bool = False


@dataclass(slots=True)
class UpdateItem:
    table: str
    keys: Buffer
    grads: Buffer
    grad_dtype: str = ""
    dim: int = 0
    lr: float | None = None


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
    limit = hosted.id_limit
    if limit is None or not len(keys):
        return
    if int(keys.view(np.uint64).max()) < limit:  # negative ids wrap to huge ones
        return
    low, high = int(keys.min()), int(keys.max())
    bad = low if low < 0 else high
    raise InvalidArgument(
        f"id {bad} is out of range for dense table {hosted.entry.spec.name!r} (0..{limit - 1})"
    )


_U64_MAX = np.iinfo(np.uint64).max


def _keys_pass(items: Sequence[Resolved]) -> bool:
    """Whether every item's keys pass ``check_owned`` and ``check_key_range``: one pass."""
    keyed = [item for item in items if len(item.keys)]
    if not keyed:
        return True
    keys = keyed[0].keys if len(keyed) == 1 else np.concatenate([item.keys for item in keyed])
    limits = [item.hosted.id_limit for item in keyed]
    if any(limit is not None for limit in limits):
        if any(limit is not None and limit < 1 for limit in limits):
            return False
        starts, position = [], 0
        for item in keyed:
            starts.append(position)
            position += len(item.keys)
        highest = np.maximum.reduceat(keys.view(np.uint64), starts)  # negative ids wrap high
        bounds = np.array([_U64_MAX if n is None else n - 1 for n in limits], np.uint64)
        if not (highest <= bounds).all():
            return False
    owners = [item.hosted.owned_slots for item in keyed]
    if all(owned is None for owned in owners):
        return True
    slots = slot_of(keys)
    first = owners[0]
    if first is not None and all(owned is first for owned in owners):  # one slot map
        return bool(first.take(slots).all())
    position = 0
    for owned, item in zip(owners, keyed, strict=True):
        end = position + len(item.keys)
        if owned is not None and not owned.take(slots[position:end]).all():
            return False
        position = end
    return True


def check_keys(items: Sequence[Resolved]) -> None:
    """``check_owned`` and ``check_key_range`` of each item in turn, cheaply when all pass."""
    if _keys_pass(items):
        return
    for index, item in enumerate(items):  # the first refusal, as the item-wise checks say it
        try:
            check_owned(item.hosted, item.keys)
            check_key_range(item.hosted, item.keys)
        except (InvalidArgument, WrongShard) as error:
            raise item_error(index, item.table, error) from None


def check_room(hosted: HostedTable, keys: Sequence[np.ndarray]) -> None:
    """Refuse when the rows these keys would insert do not fit in a table that cannot evict."""
    table = hosted.table
    if hosted.evicts:
        return
    total = sum(len(k) for k in keys)
    if table.size + total <= table.capacity:
        return  # cheap bound first: even if every key were new it fits
    distinct = np.unique(np.concatenate(keys))
    _, found = table.find(distinct)
    missing = int(len(distinct) - np.count_nonzero(found))
    if table.size + missing > table.capacity:
        raise CapacityExhausted(
            f"table {hosted.entry.spec.name!r} holds {table.size} of {table.capacity} rows; "
            f"{missing} new rows do not fit"
        )


def _check_all_room(checked: Sequence[Resolved]) -> None:
    by_table: dict[str, tuple[HostedTable, list[np.ndarray]]] = {}
    for item in checked:
        by_table.setdefault(item.hosted.entry.spec.name, (item.hosted, []))[1].append(item.keys)
    for hosted, keys in by_table.values():
        check_room(hosted, keys)


def resolve_pulls(node: Node, pulls: Sequence[tuple[str, Buffer]]) -> list[Resolved]:
    """The hosted table and int64 keys of each (table, keys) pull; nothing checked further."""
    resolved = []
    for index, (table, keys) in enumerate(pulls):
        try:
            resolved.append(Resolved(table, node.get(table), codec.decode_keys(keys)))
        except (InvalidArgument, TableNotFound) as error:
            raise item_error(index, table, error) from None
    return resolved


def check_pulls(node: Node, pulls: Sequence[Resolved], read_only: Sequence[bool]) -> None:
    """The checks ``multi_pull`` makes before its first insert, for resolved pulls.

    A MultiPull that carries updates runs these first, so a pull it would refuse
    refuses the request before any carried update is applied.
    """
    tables = node.tables
    if all(tables.get(item.table) is item.hosted for item in pulls):
        check_keys(pulls)
    else:  # a table dropped or reloaded since they were resolved: item by item, afresh
        fresh = []
        for index, item in enumerate(pulls):
            try:
                hosted = node.get(item.table)
                check_owned(hosted, item.keys)
                check_key_range(hosted, item.keys)
            except (InvalidArgument, TableNotFound, WrongShard) as error:
                raise item_error(index, item.table, error) from None
            fresh.append(Resolved(item.table, hosted, item.keys))
        pulls = fresh
    _check_all_room([item for item, ro in zip(pulls, read_only, strict=True) if not ro])


def _check_pull(node: Node, item: PullItem) -> Resolved:
    hosted = node.get(item.table)
    keys = codec.decode_keys(item.keys)
    check_owned(hosted, keys)
    check_key_range(hosted, keys)
    if item.values_out.shape != (len(keys), hosted.dim):
        raise InvalidArgument(f"reply room for {item.values_out.shape} rows, {len(keys)} keys")
    return Resolved(item.table, hosted, keys)


def _still_resolved(node: Node, items: Sequence[PullItem]) -> list[Resolved] | None:
    """The items' resolved tables and keys, if each table is still the one hosted."""
    tables, resolved = node.tables, []
    for item in items:
        r = item.resolved
        if (
            r is None
            or tables.get(item.table) is not r.hosted
            or item.values_out.shape != (len(r.keys), r.hosted.dim)
        ):
            return None
        resolved.append(r)
    return resolved


def _validate_pulls(node: Node, items: Sequence[PullItem]) -> list[Resolved]:
    """Every item's checks, or the first refusal (as item-wise checks in order would say)."""
    resolved = _still_resolved(node, items)
    if resolved is not None:
        if not all(item.checked for item in items):
            check_keys(resolved)
        return resolved
    checked = []
    for index, item in enumerate(items):
        try:
            checked.append(_check_pull(node, item))
        except (InvalidArgument, TableNotFound, WrongShard) as error:
            raise item_error(index, item.table, error) from None
    return checked


def _resolve_update(node: Node, item: UpdateItem) -> Resolved:
    hosted = node.get(item.table)
    dtype, dim = hosted.dtype, hosted.dim
    codec.check_declared("", item.dim, dtype, dim)
    grad_dtype = codec.grad_dtype_for(item.grad_dtype, dtype)
    keys = codec.decode_keys(item.keys)
    grads = codec.decode_rows(item.grads, len(keys), dim, grad_dtype, "grads")
    check_lr(item.lr)
    return Resolved(item.table, hosted, keys, grads, grad_dtype)


def _validate_updates(node: Node, items: Sequence[UpdateItem]) -> list[Resolved]:
    """Every item's checks, or the first refusal (as item-wise checks in order would say)."""
    resolved: list[Resolved] = []
    for index, item in enumerate(items):
        try:
            resolved.append(_resolve_update(node, item))
        except (InvalidArgument, TableNotFound, WrongShard) as error:
            check_keys(resolved)  # an earlier item's keys are refused first
            raise item_error(index, item.table, error) from None
    check_keys(resolved)
    return resolved


def multi_pull(node: Node, items: Sequence[PullItem]) -> int:
    """Gather every item's rows into its ``values_out``; returns the rows in all."""
    checked = _validate_pulls(node, items)
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
    checked = _validate_updates(node, items)
    tables = {c.hosted.entry.spec.name: c.hosted for c in checked}
    held = []
    try:
        for name in sorted(tables):  # one global order: multi-updates never deadlock
            tables[name].lock.acquire()
            held.append(tables[name].lock)
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
    finally:
        for lock in reversed(held):
            lock.release()
