"""What a multi-table call sends: one request per node, built natively or in Python.

A step's MultiPull (with the updates it carries) or MultiUpdate needs every
table's keys routed to their nodes and one message per node. The native
encoder (``recstore._native.encode_multi``) does that in one pass without the
GIL, byte for byte what ``recstore.core.wire`` writes; the Python planner
below does the same with numpy and ``wire`` and is kept for what the native
one leaves out: requests past the byte bound, which it cuts into several.
Either way the result is a list of ``Request``: the body to send and which
rows of which table it carries, for the reply and for resending.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recstore import _native as _native_module
from recstore.client.remote.routing import Positions, ShardRequest, plan_requests
from recstore.client.remote.tables import RemoteTable
from recstore.core import SlotMap, slot_of, wire

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

    def reaches(self, endpoint: str) -> bool:
        """Does ``endpoint`` get this item even when it owns none of the keys?"""
        if endpoint in self.also_ask:
            return True
        return self.every_shard and endpoint in self.table.endpoints


@dataclass(frozen=True)
class Part:
    index: int  # which TableCall
    positions: Positions  # into that table's keys
    epoch: int


@dataclass
class Batch:
    endpoint: str
    parts: list[Part] = field(default_factory=list)
    size: int = 0


@functools.lru_cache(maxsize=256)
def _owner_table(slot_map: SlotMap) -> np.ndarray:
    return slot_map.owner_table()  # slot maps are immutable: one table per map, reused


#: up to this many shards, one mask per shard beats sorting the keys by owner
MASK_SPLIT_MAX_SHARDS = 8


def table_requests(
    keys: np.ndarray, slot_map: SlotMap, max_rows: int, every_shard: bool
) -> list[ShardRequest]:
    """``routing.plan_requests`` with a faster split for the usual few shards (same result)."""
    shards = slot_map.num_shards
    if shards == 1 or shards > MASK_SPLIT_MAX_SHARDS:
        return plan_requests(keys, slot_map, max_rows, every_shard=every_shard)
    owners = _owner_table(slot_map)[slot_of(keys)]
    requests = []
    for shard in range(shards):
        positions = np.flatnonzero(owners == shard)
        if every_shard:
            requests.append(ShardRequest(shard, positions))
            continue
        for start in range(0, len(positions), max_rows):
            requests.append(ShardRequest(shard, positions[start : start + max_rows]))
    return requests


def plan_batches(calls: Sequence[TableCall], max_bytes: int) -> list[Batch]:
    """Requests per node: every table's parts for that node, cut at ``max_bytes`` of rows."""
    open_batches: dict[str, Batch] = {}
    batches: list[Batch] = []
    for index, call in enumerate(calls):
        slot_map, row_bytes = call.table.router.slot_map, call.table.spec.row_bytes
        max_rows = max(1, max_bytes // row_bytes)
        for request in table_requests(call.keys, slot_map, max_rows, call.every_shard):
            endpoint = call.table.endpoints[request.shard]
            size = len(request.positions) * row_bytes
            batch = open_batches.get(endpoint)
            if batch is None or (batch.parts and batch.size + size > max_bytes):
                batch = open_batches[endpoint] = Batch(endpoint)
                batches.append(batch)
            batch.parts.append(Part(index, request.positions, slot_map.epoch))
            batch.size += size
        asked = call.also_ask.intersection(call.table.endpoints)
        for endpoint in sorted(asked - {b.endpoint for b in batches if _has(b, index)}):
            batch = open_batches.get(endpoint)
            if batch is None:
                batch = open_batches[endpoint] = Batch(endpoint)
                batches.append(batch)
            batch.parts.append(Part(index, np.empty(0, np.int64), slot_map.epoch))
    return batches


def _has(batch: Batch, index: int) -> bool:
    return any(part.index == index for part in batch.parts)


@dataclass
class CarryPlan:
    """Pull requests per node, each carrying that node's share of some updates."""

    batches: list[Batch]  # the pulls; a node with only updates gets an empty batch
    carried: dict[str, Batch]  # endpoint -> update parts it carries


def plan_carrying(
    pulls: Sequence[TableCall], updates: Sequence[TableCall], max_bytes: int
) -> CarryPlan | None:
    """Each node's updates riding on its one pull request; None when they do not fit.

    Updates may only ride on a node's single request (two requests to a node run
    in no particular order) and within the byte bound; otherwise the caller sends
    them first, on their own.
    """
    batches = plan_batches(pulls, max_bytes)
    carried: dict[str, Batch] = {}
    for batch in plan_batches(updates, max_bytes):
        if batch.endpoint in carried:
            return None
        carried[batch.endpoint] = batch
    pull_requests: dict[str, int] = {}
    for batch in batches:
        pull_requests[batch.endpoint] = pull_requests.get(batch.endpoint, 0) + 1
        extra = carried.get(batch.endpoint)
        if extra is not None and batch.size + extra.size > max_bytes:
            return None
    if any(pull_requests.get(endpoint, 0) > 1 for endpoint in carried):
        return None
    batches += [Batch(endpoint) for endpoint in carried if endpoint not in pull_requests]
    return CarryPlan(batches, carried)


def _pull_items(calls: Sequence[TableCall], parts: list[Part]) -> list[wire.PullRequest]:
    return [
        wire.PullRequest(
            calls[p.index].name, p.epoch, calls[p.index].keys[p.positions].data,
            value_dtype=calls[p.index].table.transport,
        )
        for p in parts
    ]  # fmt: skip


def _update_items(calls: Sequence[TableCall], parts: list[Part]) -> list[wire.UpdateRequest]:
    items = []
    for p in parts:
        call = calls[p.index]
        grad_dtype = call.table.transport or wire.dtype_name(call.rows)
        grads = wire.as_wire_dtype(call.rows[p.positions], grad_dtype)
        items.append(
            wire.UpdateRequest(
                call.name, p.epoch, call.keys[p.positions].data, grads.data,
                grad_dtype, call.lr, call.table.spec.embedding_dim,
            )
        )  # fmt: skip
    return items


@dataclass
class Request:
    """One node's request of a multi call and what it carries."""

    endpoint: str
    parts: list[Part]  # the call's own items, in message order
    carried: list[Part]  # updates a MultiPull carries, in message order
    body: bytes
    #: native scatter targets of ``parts`` (None: the reply is read in Python)
    targets: list[tuple[Any, ...]] | None = None


def python_requests(
    method: str, calls: Sequence[TableCall], carried: Sequence[TableCall], max_bytes: int
) -> list[Request] | None:
    """The requests, planned with numpy; None when ``carried`` cannot ride (too big)."""
    riding: dict[str, Batch] = {}
    if carried:
        plan = plan_carrying(calls, carried, max_bytes)
        if plan is None:
            return None
        batches, riding = plan.batches, plan.carried
    else:
        batches = plan_batches(calls, max_bytes)
    requests = []
    for batch in batches:
        extra = riding.get(batch.endpoint)
        extra_parts = extra.parts if extra else []
        if method == "MultiPull":
            body = wire.encode_multi_pull_request(
                _pull_items(calls, batch.parts), _update_items(carried, extra_parts)
            )
        else:
            body = wire.encode_multi_update_request(_update_items(calls, batch.parts))
        requests.append(Request(batch.endpoint, batch.parts, extra_parts, body))
    return requests


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
    """The requests, encoded natively; None when one would pass ``max_bytes``."""
    pulls, updates = (calls, carried) if method == "MultiPull" else ((), calls)
    nodes = tuple(dict.fromkeys(e for c in (*pulls, *updates) for e in c.table.endpoints))
    index = {endpoint: i for i, endpoint in enumerate(nodes)}
    pull_args = []
    for call in pulls:
        asked = [index[e] for e in sorted(call.also_ask) if e in index]
        pull_args.append((*_keys_args(call, nodes), call.table.transport, asked))
    update_args = []
    for call in updates:
        every = [index[e] for e in call.table.endpoints] if call.every_shard else []
        update_args.append((
            *_keys_args(call, nodes), call.rows, call.table.transport, call.lr,
            call.table.spec.embedding_dim, every,
        ))  # fmt: skip
    bodies, pull_routes, update_routes = _native.encode_multi(
        method, pull_args, update_args, len(nodes)
    )
    if any(body is not None and len(body) > max_bytes for body in bodies):
        return None
    own, own_routes = (pulls, pull_routes) if method == "MultiPull" else (updates, update_routes)
    requests = []
    for node, body in enumerate(bodies):
        if body is None:
            continue
        parts = _parts(own, own_routes, node, nodes[node])
        carried_parts = (
            _parts(updates, update_routes, node, nodes[node]) if method == "MultiPull" else []
        )
        targets = None
        if method == "MultiPull":
            targets = []
            for part in parts:
                call, (order, offsets, counts) = pulls[part.index], pull_routes[part.index]
                targets.append((
                    call.rows, call.table.transport, call.table.spec.embedding_dim, order,
                    int(offsets[node]), int(counts[node]),
                ))  # fmt: skip
        requests.append(Request(nodes[node], parts, carried_parts, body, targets))
    return requests


def _parts(
    calls: Sequence[TableCall], routes: Sequence[Any], node: int, endpoint: str
) -> list[Part]:
    """The items of ``calls`` the native encoder put in ``node``'s request, in order."""
    parts = []
    for index, (call, (order, offsets, counts)) in enumerate(zip(calls, routes, strict=True)):
        count = int(counts[node])
        if count or call.reaches(endpoint):
            start, epoch = int(offsets[node]), call.table.router.slot_map.epoch
            parts.append(Part(index, order[start : start + count], epoch))
    return parts


def build_requests(
    method: str, calls: Sequence[TableCall], max_bytes: int, carried: Sequence[TableCall] = ()
) -> list[Request] | None:
    """Native requests when they fit, else Python's (cut at ``max_bytes``).

    None when ``carried`` updates cannot ride on the pulls: the caller sends
    them on their own first.
    """
    if method not in ("MultiPull", "MultiUpdate"):
        raise ValueError(f"not a multi-table method: {method!r}")
    if carried and method != "MultiPull":
        raise ValueError("only a MultiPull carries updates")
    requests = native_requests(method, calls, carried, max_bytes)
    if requests is None:
        requests = python_requests(method, calls, carried, max_bytes)
    return requests
