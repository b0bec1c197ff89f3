"""What a multi-table call sends: its requests, planned and encoded natively.

A step's MultiPull (with the updates it carries) or MultiUpdate needs every
table's keys routed to their nodes and one message per node, cut into several
past the byte bound. The native encoder (``recstore._native.encode_multi``)
routes, plans and writes them in one pass without the GIL, byte for byte what
``recstore.core.wire`` writes, keys and gradients gathered straight into the
message. The result is a list of ``Request``: the body to send and which rows
of which table it carries, for the reply and for resending.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from recstore import _native as _native_module
from recstore.client.remote.routing import Positions
from recstore.client.remote.tables import RemoteTable
from recstore.core import SlotMap

#: the compiled codec (no type stubs)
_native: Any = _native_module


@dataclass
class TableCall:
    """One table's share of a multi call: ``rows`` is the pull's output or the update's grads."""

    table: RemoteTable
    keys: np.ndarray
    rows: np.ndarray
    lr: float | None = None
    every_shard: bool = False  # adam: every shard sees every step
    #: pulls: nodes that get the item even with none of its keys, to answer the
    #: table's version (a client cache checking its rows are current)
    also_ask: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return str(self.table.spec.name)


@dataclass(frozen=True)
class Part:
    index: int  # which TableCall
    positions: Positions  # into that table's keys
    epoch: int


@dataclass
class Request:
    """One node's request of a multi call and what it carries."""

    endpoint: str
    parts: list[Part]  # the call's own items, in message order
    carried: list[Part]  # updates a MultiPull carries, in message order
    body: bytes
    #: a MultiPull's scatter targets of ``parts`` (``scatter_pull_reply``); None: an update
    targets: list[tuple[Any, ...]] | None = None


@functools.lru_cache(maxsize=256)
def _owner_table(slot_map: SlotMap) -> np.ndarray:
    return slot_map.owner_table()  # slot maps are immutable: one table per map, reused


@functools.lru_cache(maxsize=256)
def _node_of_slot(
    slot_map: SlotMap, endpoints: tuple[str, ...], nodes: tuple[str, ...]
) -> np.ndarray:
    """Node index (into ``nodes``) of each slot: the slot map composed with the endpoints."""
    index = {endpoint: i for i, endpoint in enumerate(nodes)}
    node_of_shard = np.array([index[endpoint] for endpoint in endpoints], np.int32)
    return np.ascontiguousarray(node_of_shard[_owner_table(slot_map)])


def _keys_args(call: TableCall, nodes: tuple[str, ...]) -> tuple[Any, ...]:
    """(table, epoch, keys, node of each slot): an item's head (the encoder checks the arrays)."""
    slot_map = call.table.router.slot_map
    owners = _node_of_slot(slot_map, tuple(call.table.endpoints), nodes)
    return (call.name, slot_map.epoch, call.keys, owners)


def native_requests(
    method: str, calls: Sequence[TableCall], carried: Sequence[TableCall], max_bytes: int
) -> list[Request] | None:
    """The requests, planned and encoded natively (``encode_multi``); None when ``carried``
    cannot ride on the pulls (they would pass ``max_bytes``, or a node needs two requests)."""
    pulls, updates = (calls, carried) if method == "MultiPull" else ((), calls)
    nodes = tuple(dict.fromkeys(e for c in (*pulls, *updates) for e in c.table.endpoints))
    index = {endpoint: i for i, endpoint in enumerate(nodes)}
    pull_args = []
    for call in pulls:
        asked = [index[e] for e in sorted(call.also_ask) if e in index]
        pull_args.append((
            *_keys_args(call, nodes), call.table.transport, asked, call.table.spec.row_bytes,
        ))  # fmt: skip
    update_args = []
    for call in updates:
        every = [index[e] for e in call.table.endpoints] if call.every_shard else []
        update_args.append((
            *_keys_args(call, nodes), call.rows, call.table.transport, call.lr,
            call.table.spec.embedding_dim, every, call.table.spec.row_bytes,
        ))  # fmt: skip
    encoded = _native.encode_multi(method, pull_args, update_args, len(nodes), max_bytes)
    if encoded is None:
        return None
    planned, pull_routes, update_routes = encoded
    own, own_routes = (pulls, pull_routes) if method == "MultiPull" else (updates, update_routes)
    requests = []
    for node, body, pull_spans, update_spans in planned:
        own_spans = pull_spans if method == "MultiPull" else update_spans
        parts = _parts(own, own_routes, node, own_spans)
        carried_parts = (
            _parts(updates, update_routes, node, update_spans) if method == "MultiPull" else []
        )
        targets = None
        if method == "MultiPull":
            targets = []
            for item, start, count in pull_spans:
                call, (order, offsets, _) = pulls[item], pull_routes[item]
                targets.append((
                    call.rows, call.table.transport, call.table.spec.embedding_dim, order,
                    int(offsets[node]) + start, count,
                ))  # fmt: skip
        requests.append(Request(nodes[node], parts, carried_parts, body, targets))
    return requests


def _parts(
    calls: Sequence[TableCall], routes: Sequence[Any], node: int, spans: Sequence[Any]
) -> list[Part]:
    """The items ``spans`` (item, start, count) put in ``node``'s request, in order."""
    parts = []
    for item, start, count in spans:
        order, offsets, _ = routes[item]
        first = int(offsets[node]) + start
        parts.append(
            Part(item, order[first : first + count], calls[item].table.router.slot_map.epoch)
        )
    return parts


def build_requests(
    method: str, calls: Sequence[TableCall], max_bytes: int, carried: Sequence[TableCall] = ()
) -> list[Request] | None:
    """The requests of a multi call, cut at ``max_bytes`` of rows.

    None when ``carried`` updates cannot ride on the pulls: the caller sends
    them on their own first.
    """
    if method not in ("MultiPull", "MultiUpdate"):
        raise ValueError(f"not a multi-table method: {method!r}")
    if carried and method != "MultiPull":
        raise ValueError("only a MultiPull carries updates")
    return native_requests(method, calls, carried, max_bytes)
