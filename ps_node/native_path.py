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
cannot deadlock) around checking and applying, and call the engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from recstore import _native as _native_module
from recstore.core import (
    CapacityExhausted,
    InferenceTable,
    InvalidArgument,
    MessageTooLarge,
    NonFiniteValues,
    RecStoreError,
    TableNotFound,
    WrongShard,
    ps_fields,
    slot_of,
    wire,
)
from recstore.core.limits import DEFAULT_MESSAGE_LIMIT
from recstore.core.request_id import Named
from recstore.ps import codec, dedup, multi
from recstore.ps.dedup import Entry
from recstore.ps.multi import CarriedUpdatesApplied, Served
from recstore.ps.node import HostedTable, Node, WriteAck
from recstore.store.options import non_finite_code

#: the compiled engine (no type stubs: it takes raw buffer addresses)
_native: Any = _native_module

#: False: the node applies every checked request itself (tests run both ways)
APPLY_NATIVELY = True

#: the native validator's refusal codes (csrc/node_serve.h, enum Code)
REFUSALS: dict[int, type[RecStoreError]] = {
    1: InvalidArgument,
    2: TableNotFound,
    3: WrongShard,
    4: CapacityExhausted,
    5: MessageTooLarge,
}


def refusal_error(code: int, item: int, table: str, reason: str, epoch: int) -> RecStoreError:
    """The exception of a refusal: its reason, prefixed with the item it is about (if any)."""
    message = reason if item < 0 else f"item {item} (table {table!r}): {reason}"
    if code == 3:
        return WrongShard(message, epoch)
    if code == 6:
        return NonFiniteValues(message, table=table)
    if code == 7:
        return InferenceTable(f"item {item}: {InferenceTable.of(table)}", table=table)
    return REFUSALS[code](message)


def _view(hosted: HostedTable) -> tuple[Any, ...]:
    """The validator's view of a hosted table (see csrc/node_serve_bindings.h)."""
    owned = hosted.owned_slots
    return (
        hosted.table.host_engine,
        0 if owned is None else owned.ctypes.data,  # bool per slot, kept alive by hosted
        float(hosted.entry.spec.optimizer.lr),
        hosted.dtype,
        hosted.dim,
        hosted.id_limit or 0,
        not hosted.evicts and hosted.id_limit is None,
        hosted.entry.slot_map.epoch,
        hosted.wal is not None,
        non_finite_code(hosted.entry.spec),
        hosted.entry.spec.inference,
    )


def serve(
    node: Node,
    method: str,
    request: bytes,
    reply_limit: int = DEFAULT_MESSAGE_LIMIT,
    named: Named | None = None,
) -> Served:
    """Check ``request`` (MultiPull or MultiUpdate) and serve it; refusals raise.

    A reply over ``reply_limit`` bytes (the node's message limit) is refused before
    anything is allocated for it. A ``named`` request whose updates were applied
    already is answered with their recorded rows (a MultiPull's pulls are served
    again); one being applied now is first waited for.
    """
    if named is None:
        return _serve(node, method, request, reply_limit, None)
    parsed = _parse(method, request)
    names = sorted(parsed.update_tables)
    hosted = [node.tables.get(name) for name in names]
    if not names or any(h is None for h in hosted):
        return _serve(node, method, request, reply_limit, None)  # refused as the item it is
    windows = [h.window for h in hosted if h is not None]
    known = dedup.begin_all(windows, named.request_id, named.digest)
    if known is not None:
        return _answer_applied(node, method, named, hosted, known, reply_limit)
    try:
        entries = _entries(method, request, named)
        served = _serve(node, method, request, reply_limit, entries, parsed)
    except CarriedUpdatesApplied:  # the pulls failed, the updates are in: recorded
        for name, window in zip(names, windows, strict=True):
            window.finish(entries[name])
        raise
    except BaseException:
        dedup.abandon_all(windows, named.request_id)
        raise
    rows = tuple(r for _, r in served.updated)
    for name, table in zip(names, hosted, strict=True):
        assert table is not None
        seqs = [a.seq for a in served.acks if a.wal is not None and a.wal is table.wal]
        table.window.finish(replace(entries[name], rows=rows, log_seq=max(seqs, default=0)))
    return served


def _parse(method: str, request: bytes) -> Any:
    try:
        return _native.MultiRequest(method, request)
    except ValueError as error:
        raise InvalidArgument(f"malformed {method}Request: {error}") from None


def _entries(method: str, request: bytes, named: Named) -> dict[str, Entry]:
    """The de-dup entry of each updated table: rows per update item, slots it touches."""
    if method == "MultiPull":
        _, items = wire.decode_multi_pull_carrying(request)
    else:
        items = wire.decode_multi_update_request(request)
    keys_of: dict[str, list[np.ndarray]] = {}
    rows = []
    for item in items:
        keys = codec.decode_keys(item.keys)
        rows.append(len(keys))
        keys_of.setdefault(item.table, []).append(keys)
    return {
        name: Entry(
            named.request_id,
            named.digest,
            tuple(rows),
            dedup.slots_touched(slot_of(np.concatenate(keys))),
        )
        for name, keys in keys_of.items()
    }


def _answer_applied(
    node: Node,
    method: str,
    named: Named,
    hosted: list[HostedTable | None],
    known: list[Entry],
    reply_limit: int,
) -> Served:
    """The reply of a request whose updates were applied: their recorded rows."""
    rows = known[0].rows
    acks = [
        WriteAck(0, table.wal, entry.log_seq)
        for table, entry in zip(hosted, known, strict=True)
        if table is not None and entry.log_seq
    ]
    if method == "MultiUpdate":
        return Served(wire.encode_multi_rows_response(rows), [], [], acks)
    pulls = _serve(node, method, named.rest, reply_limit, None)
    return Served(pulls.reply + _carried_rows(rows), pulls.pulled, [], acks)


def _carried_rows(rows: tuple[int, ...]) -> bytes:
    """MultiPullResponse.updates fields, appended to a reply of the pulls alone."""
    tag = wire.encode_varint(ps_fields.MultiPullResponse.updates << 3 | 2)
    fields = []
    for count in rows:
        update = wire.encode_rows_response(count)
        fields += [tag, wire.encode_varint(len(update)), update]
    return b"".join(fields)


def _serve(
    node: Node,
    method: str,
    request: bytes,
    reply_limit: int,
    named: Mapping[str, Entry] | None,
    parsed: Any = None,
) -> Served:
    if parsed is None:
        parsed = _parse(method, request)
    names = parsed.tables
    node.check_servable(names)
    hosted = [node.tables.get(name) for name in names]
    by_name = dict(zip(names, hosted, strict=True))
    with contextlib.ExitStack() as locks:
        for name in sorted(parsed.update_tables):
            table = by_name[name]
            if table is None:
                continue  # refused as the item it is
            locks.enter_context(table.lock)
            if node.tables.get(name) is not table:  # dropped or reloaded meanwhile
                raise TableNotFound(f"table {name!r} is not hosted on this node")
        views = [None if h is None else _view(h) for h in hosted]
        result = parsed.serve(views, APPLY_NATIVELY, reply_limit)
        if result[0] == "checked":
            _, pulls, updates = result
            return multi.apply_checked(
                node, method, request, hosted, pulls, updates, reply_limit, named
            )
    kind = result[0]
    if kind == "refused":
        raise refusal_error(*result[1:])
    if kind == "failed":
        _, message, capacity, updates_applied, updates = result
        if updates_applied and updates and method == "MultiPull":
            raise CarriedUpdatesApplied(
                f"the {updates} carried updates were applied, the pulls failed: {message}"
            )
        raise (CapacityExhausted if capacity else InvalidArgument)(message)
    _, reply, pulled, updated = result
    return Served(reply, pulled, updated)
