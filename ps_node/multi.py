"""MultiPull and MultiUpdate items applied by the node, once the native validator passed them.

A trainer with many tables would otherwise pay one RPC per table and shard on
every step; these run several tables' pulls or updates in one call, all or
nothing. Whether a request is refused, and why, is decided in one place: the
native validator (``recstore.ps.native_path``, ``csrc/node_serve.h``), which
also parses the request. Most requests it serves itself; the checked items of
those it cannot apply (a table on a GPU or with an injected clock, a
write-ahead log to append, read-only pulls) come here, as offsets into the
request, with the update tables' locks held by the caller. Every update's log
record is appended before any update is applied (``Node.write_logged``: a
record that cannot be written refuses the whole request, nothing applied),
then the updates apply in order (the caller waits for every record to be
durable before it replies), then the pulls are written into the reply.

The validator counts the room left in a table that cannot evict only where it
can read the rows (a host engine); ``check_room`` counts it for the others
before anything is applied.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from recstore.core import CapacityExhausted, wire
from recstore.core.errors import CarriedUpdatesApplied
from recstore.ps import codec
from recstore.ps.hosted_table import HostedTable
from recstore.ps.node import Node, Write, WriteAck, pull_into
from recstore.ps.wal.dedup import Entry
from recstore.ps.wal.records import OP_UPDATE


@dataclass(frozen=True)
class Served:
    """A served request: the reply, which tables moved how many rows, the log acks to await."""

    reply: bytes
    pulled: list[tuple[str, int]]  # (table, rows) per pull item
    updated: list[tuple[str, int]]  # (table, rows) per update
    acks: list[WriteAck] = field(default_factory=list)


#: a checked pull: (hosted table, keys, read_only, the dtype its rows travel as)
PullItem = tuple[HostedTable, np.ndarray, bool, str]


def check_room(hosted: HostedTable, keys: Sequence[np.ndarray]) -> None:
    """Refuse when the rows these keys would insert do not fit in a table that cannot evict."""
    table = hosted.table
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


def pull_items(
    items: Sequence[PullItem], outs: Sequence[tuple[np.ndarray, np.ndarray | None]]
) -> None:
    """Each pull's rows into its place in the reply (read-only ones with their found flags)."""
    for (hosted, keys, _, value_dtype), (values, found_out) in zip(items, outs, strict=True):
        pull_into(hosted, keys, values, found_out, value_dtype)


def apply_checked(
    node: Node,
    method: str,
    request: bytes,
    tables: Sequence[HostedTable | None],
    pulls: Sequence[tuple[int, int, int, bool, str]],
    updates: Sequence[tuple[int, int, int, int, int, str, float | None]],
    reply_limit: int,
    named: Mapping[str, Entry] | None = None,
) -> Served:
    """Apply the validator's checked items (offsets into ``request``, tables by index).

    The validator refused a reply over ``reply_limit`` already; the frame checks it again.
    ``named``: the request's de-dup entry per updated table, logged with its records.
    """
    buffer = memoryview(request)
    pulled: list[PullItem] = []
    versions = []  # each pull's table version, read before any row is (PullResponse.version)
    for table, keys_at, rows, read_only, value_dtype in pulls:
        hosted = tables[table]
        assert hosted is not None  # the validator refused items of tables not hosted
        keys = codec.decode_keys(buffer[keys_at : keys_at + 8 * rows])
        pulled.append((hosted, keys, read_only, value_dtype))
        versions.append(hosted.version)
    checked: list[tuple[Write, np.ndarray]] = []  # each update and its keys
    for table, keys_at, rows, grads_at, grads_size, grad_dtype, lr in updates:
        hosted = tables[table]
        assert hosted is not None
        keys_buffer = buffer[keys_at : keys_at + 8 * rows]
        grads_buffer = buffer[grads_at : grads_at + grads_size]
        keys = codec.decode_keys(keys_buffer)
        grads = codec.decode_rows(grads_buffer, rows, hosted.dim, grad_dtype, "grads")
        apply = functools.partial(hosted.table.update, keys, grads, lr)
        entry = None if named is None else named[hosted.entry.spec.name]
        write = Write(
            hosted, OP_UPDATE, keys_buffer, grads_buffer, grad_dtype, lr, apply, request=entry
        )
        checked.append((write, keys))
    inserting: dict[str, tuple[HostedTable, list[np.ndarray]]] = {}
    for hosted, keys in [(w.hosted, k) for w, k in checked] + [
        (p[0], p[1]) for p in pulled if not p[2]
    ]:
        if hosted.table.host_engine is None and not hosted.evicts and hosted.id_limit is None:
            inserting.setdefault(hosted.entry.spec.name, (hosted, []))[1].append(keys)
    for hosted, keys_list in inserting.values():
        check_room(hosted, keys_list)
    acks = node.write_logged([write for write, _ in checked])
    for write, keys in checked:
        node.reshards.record(write.hosted.entry.spec.name, keys)
    updated = [(w.hosted.entry.spec.name, a.rows) for (w, _), a in zip(checked, acks, strict=True)]
    if method == "MultiUpdate":
        return Served(wire.encode_multi_rows_response(ack.rows for ack in acks), [], updated, acks)
    shapes = [(len(keys), h.dim, dtype, read_only) for h, keys, read_only, dtype in pulled]
    message, outs = wire.multi_pull_response_frame(
        shapes, carried_rows=[a.rows for a in acks], versions=versions, limit=reply_limit
    )
    try:
        pull_items(pulled, outs)
    except Exception as error:
        if checked:  # rare (an engine failure): say the updates are in
            raise CarriedUpdatesApplied(
                f"the {len(checked)} carried updates were applied, the pulls failed: {error}"
            ) from error
        raise
    for hosted, keys, read_only, _ in pulled:
        if not read_only:  # any of them may be a new row
            node.reshards.record(hosted.entry.spec.name, keys)
            hosted.note_pulled(keys)
    reply = wire.finish(message)
    return Served(reply, [(h.entry.spec.name, len(k)) for h, k, _, _ in pulled], updated, acks)
