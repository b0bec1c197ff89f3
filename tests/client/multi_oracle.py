"""The multi-table planner in Python: the oracle of the native one (``encode_multi``).

Each table's keys split per owner shard (``routing.plan_requests``, the
single-table router's planner), grouped per node and cut at the byte bound,
updates riding on a node's one pull; the bodies written by
``recstore.core.wire``. The native planner must give the same requests, byte
for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from recstore.client.remote.requests import Part, Request, TableCall
from recstore.client.remote.routing import plan_requests
from recstore.core import wire


@dataclass
class Batch:
    endpoint: str
    parts: list[Part] = field(default_factory=list)
    size: int = 0


def plan_batches(calls: Sequence[TableCall], max_bytes: int) -> list[Batch]:
    """Requests per node: every table's parts for that node, cut at ``max_bytes`` of rows."""
    open_batches: dict[str, Batch] = {}
    batches: list[Batch] = []
    for index, call in enumerate(calls):
        slot_map, row_bytes = call.table.router.slot_map, call.table.spec.row_bytes
        max_rows = max(1, max_bytes // row_bytes)
        for request in plan_requests(call.keys, slot_map, max_rows, every_shard=call.every_shard):
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
