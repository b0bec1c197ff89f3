"""MultiPull and MultiUpdate: parsed once and checked by the native validator, then served.

``recstore._native.MultiRequest`` parses a request in place and checks every
item against the node's hosted tables (see ``csrc/node_serve.h``): it is the
one place that decides whether a multi-table request is refused, and why. A
refusal comes back as (code, item, table, reason, epoch), which
``refusal_error`` turns into the exception the servicer maps to a status. A
request that passes is served by the engine in the same native call, reply
framed, or, where the native path cannot apply it (a table on a GPU or with an
injected clock, a write-ahead log to append, read-only pulls), its checked
items are applied by ``recstore.ps.multi``. Here: resolve the named tables,
hold the write locks of the updated ones (in name order, so two requests
cannot deadlock) around checking and applying, and call the engine. A table
saved incrementally stays on the native path: the engine reports the items it
applied (their keys as offsets into the request) and they are recorded in the
table's change tracker under the same locks, as the node's own path records
them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from recstore import _native as _native_module
from recstore.core import (
    CapacityExhausted,
    InferenceTable,
    InvalidArgument,
    MalformedMessage,
    MessageTooLarge,
    NonFiniteValues,
    RecStoreError,
    TableNotFound,
    WrongShard,
)
from recstore.core.errors import CarriedUpdatesApplied
from recstore.core.limits import DEFAULT_MESSAGE_LIMIT
from recstore.ps import codec, multi
from recstore.ps.hosted_table import HostedTable
from recstore.ps.multi import Served
from recstore.ps.node import Node
from recstore.ps.wal.dedup import Entry
from recstore.store.options import non_finite_code

#: the compiled engine (no type stubs)
_native: Any = _native_module

#: False: the node applies every checked request itself (tests run both ways)
APPLY_NATIVELY = True

#: the validator's refusal codes, numbered by the engine (csrc/node_serve.h, enum Code)
Code: Any = _native.RefusalCode
#: the exception of each refusal worded by its reason alone
REFUSALS: dict[Any, type[RecStoreError]] = {
    Code.INVALID_ARGUMENT: InvalidArgument,
    Code.TABLE_NOT_FOUND: TableNotFound,
    Code.CAPACITY_EXHAUSTED: CapacityExhausted,
    Code.MESSAGE_TOO_LARGE: MessageTooLarge,
}

#: a native result's item: (index into the request's tables, rows, offset of its keys)
NativeItem = tuple[int, int, int]


def refusal_error(code: Any, item: int, table: str, reason: str, epoch: int) -> RecStoreError:
    """The exception of a refusal: its reason, prefixed with the item it is about (if any)."""
    message = reason if item < 0 else f"item {item} (table {table!r}): {reason}"
    if code == Code.WRONG_SHARD:
        return WrongShard(message, epoch)
    if code == Code.NON_FINITE:
        return NonFiniteValues(message, table=table)
    if code == Code.INFERENCE_TABLE:
        return InferenceTable(f"item {item}: {InferenceTable.of(table)}", table=table)
    return REFUSALS[code](message)


def _view(hosted: HostedTable, moving: bool) -> tuple[Any, ...]:
    """The validator's view of a hosted table (see csrc/node_serve_bindings.h).

    A table moving slots out is applied by the node (no engine here), which
    records the changed keys for the move; the keys the engine changes in a
    table saved incrementally are noted by ``_note_changes``.
    """
    return (
        None if moving else hosted.table.host_engine,
        hosted.owned_slots,  # bool per slot; None: every slot
        float(hosted.entry.spec.optimizer.lr),
        hosted.dtype,
        hosted.dim,
        hosted.id_limit or 0,
        not hosted.evicts and hosted.id_limit is None,
        hosted.entry.slot_map.epoch,
        hosted.wal is not None,
        non_finite_code(hosted.entry.spec),
        hosted.entry.spec.inference,
        hosted.version,  # read before any row is: the reply's PullResponse.version
    )


def fast_tables(node: Node) -> list[tuple[str, tuple[Any, ...], Any, HostedTable]]:
    """The tables whose pulls the server may serve without the node
    (``csrc/node_fast_path.h``): a host engine, no slots moving out (their changes
    are recorded for the move), no pulled keys to record for an incremental
    checkpoint. Each as (name, validator view, version cell, the table: what keeps
    the view's engine and slot mask alive)."""
    out = []
    for name, hosted in sorted(node.tables.items()):
        moving = node.reshards.tracks(name)
        if hosted.table.host_engine is None or moving:
            continue
        if hosted.changes is not None and hosted.drops_rows:
            continue
        out.append((name, _view(hosted, moving), hosted.version_cell, hosted))
    return out


def parse(method: str, request: bytes) -> Any:
    try:
        return _native.MultiRequest(method, request)
    except ValueError as error:
        raise MalformedMessage(f"malformed {method}Request: {error}") from None


def serve(
    node: Node,
    method: str,
    request: bytes,
    reply_limit: int = DEFAULT_MESSAGE_LIMIT,
    logged: Mapping[str, Entry] | None = None,
    parsed: Any = None,
) -> Served:
    """Check ``request`` (MultiPull or MultiUpdate) and serve it; refusals raise.

    A reply over ``reply_limit`` bytes (the node's message limit) is refused before
    anything is allocated for it. ``logged``: the de-dup entry per updated table of
    a named request (``recstore.ps.named_multi``), written with its log records;
    ``parsed``: the request as ``parse`` read it already.
    """
    if parsed is None:
        parsed = parse(method, request)
    names = parsed.tables
    node.check_servable(names)
    hosted = [node.tables.get(name) for name in names]
    by_name = dict(zip(names, hosted, strict=True))
    with contextlib.ExitStack() as locks:
        for name in sorted(set(names)):  # held while any of their slots is sealed
            table = by_name[name]
            if table is not None and node.reshards.tracks(name):
                epoch = table.entry.slot_map.epoch
                locks.enter_context(node.reshards.admitted(name, None, epoch))
        for name in sorted(parsed.update_tables):
            table = by_name[name]
            if table is None:
                continue  # refused as the item it is
            locks.enter_context(table.lock)
            if node.tables.get(name) is not table:  # dropped or reloaded meanwhile
                raise TableNotFound(f"table {name!r} is not hosted on this node")
        views = [
            None if h is None else _view(h, node.reshards.tracks(h.entry.spec.name)) for h in hosted
        ]
        result = parsed.serve(views, APPLY_NATIVELY, reply_limit)
        kind = result[0]
        if kind == "checked":
            _, pulls, updates = result
            return multi.apply_checked(
                node, method, request, hosted, pulls, updates, reply_limit, logged
            )
        if kind == "failed":  # the updates applied whole are changes all the same
            _note_changes(request, hosted, result[3], [])
        elif kind == "served":  # noted while the locks are held, as the node's path does
            _note_changes(request, hosted, result[3], result[2])
    if kind == "refused":
        raise refusal_error(*result[1:])
    if kind == "failed":
        _, message, capacity, applied, updates = result
        if updates and len(applied) == updates and method == "MultiPull":
            raise CarriedUpdatesApplied(
                f"the {updates} carried updates were applied, the pulls failed: {message}"
            )
        raise (CapacityExhausted if capacity else InvalidArgument)(message)
    _, reply, pulled, updated = result
    return Served(reply, _named(names, pulled), _named(names, updated))


def _named(names: list[str], items: list[NativeItem]) -> list[tuple[str, int]]:
    return [(names[table], rows) for table, rows, _ in items]


def _note_changes(
    request: bytes,
    hosted: list[HostedTable | None],
    updated: list[NativeItem],
    pulled: list[NativeItem],
) -> None:
    """The keys the engine applied, into the change tracker of every table saved
    incrementally: what the node's path records (``Node.write_logged`` each update's
    keys, then ``HostedTable.note_pulled`` each pull's), so both paths leave the
    same changes."""
    buffer = memoryview(request)
    width = codec.KEY_DTYPE.itemsize
    for items, note in ((updated, False), (pulled, True)):
        for table, rows, keys_at in items:
            tracked = hosted[table]
            if tracked is None or tracked.changes is None:
                continue
            keys = codec.decode_keys(buffer[keys_at : keys_at + width * rows])
            if note:
                tracked.note_pulled(keys)
            else:
                tracked.changes.record(keys)
