"""Named MultiPull and MultiUpdate requests: their updates applied once per request id.

A request naming itself (``recstore.core.request_id``) is looked up in the de-dup
window of every table it updates (``recstore.ps.wal.dedup.begin_all``, in name
order) before it is checked and served by ``recstore.ps.native_path``: applied
already, it is answered with the recorded rows (a MultiPull's pulls are served
again, from the request without its carried updates); being applied right now,
it first waits for that outcome; new, it is served with its entries logged
with its records, then recorded in each window. Refused before anything was
applied, the windows forget it, so a resend may apply it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from recstore.core import ps_fields, wire
from recstore.core.errors import CarriedUpdatesApplied
from recstore.core.request_id import Named
from recstore.ps import native_path
from recstore.ps.hosted_table import HostedTable
from recstore.ps.multi import Served
from recstore.ps.node import Node, WriteAck
from recstore.ps.wal import dedup
from recstore.ps.wal.dedup import Entry


def serve(node: Node, method: str, request: bytes, reply_limit: int, named: Named) -> Served:
    """Serve a ``named`` MultiPull or MultiUpdate (see the module docstring)."""
    parsed = native_path.parse(method, request)
    names = sorted(parsed.update_tables)
    hosted = [node.tables.get(name) for name in names]
    if not names or any(h is None for h in hosted):
        return native_path.serve(node, method, request, reply_limit)  # refused as its item
    windows = [h.window for h in hosted if h is not None]
    known = dedup.begin_all(windows, named.request_id, named.digest)
    if known is not None:
        return _answer_applied(node, method, named, hosted, known, reply_limit)
    try:
        entries = _entries(parsed, named)
        served = native_path.serve(node, method, request, reply_limit, entries, parsed)
    except CarriedUpdatesApplied:  # the pulls failed, the updates are in: recorded
        for name, window in zip(names, windows, strict=True):
            window.finish(entries[name])
        raise
    except BaseException:
        dedup.abandon_all(windows, named.request_id)
        raise
    for name, table in zip(names, hosted, strict=True):
        assert table is not None
        entry = entries[name]  # its rows are what was served: the keys of each item
        seqs = [a.seq for a in served.acks if a.wal is not None and a.wal is table.wal]
        table.window.finish(replace(entry, log_seq=max(seqs)) if seqs else entry)
    return served


def _entries(parsed: Any, named: Named) -> dict[str, Entry]:
    """The de-dup entry of each updated table: rows per update item, slots its keys
    touch (both read by the engine from the ``parsed`` request)."""
    rows = tuple(parsed.update_rows)
    return {
        name: Entry(named.request_id, named.digest, rows, slots)
        for name, slots in parsed.update_slots()
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
    pulls = native_path.serve(node, method, named.rest, reply_limit, None)
    return Served(pulls.reply + _carried_rows(rows), pulls.pulled, [], acks)


def _carried_rows(rows: tuple[int, ...]) -> bytes:
    """MultiPullResponse.updates fields, appended to a reply of the pulls alone."""
    tag = wire.encode_varint(ps_fields.MultiPullResponse.updates << 3 | 2)
    fields = []
    for count in rows:
        update = wire.encode_rows_response(count)
        fields += [tag, wire.encode_varint(len(update)), update]
    return b"".join(fields)
