"""Several tables' rows in one request per PS node: MultiPull and MultiUpdate.

A training step over many tables would otherwise send one Pull and one Update
per table and shard, and on a Python node each RPC costs far more than the
rows it moves. Here every table's keys are routed by that table's own slot
map, the (table, shard) parts are grouped by node, and each node gets one
request (cut into several only past the batch byte bound). Pulled rows are
checked and copied straight into each table's output array, as single pulls
do. A node refuses a request whole, applying nothing, when it no longer owns
some slots (FAILED_PRECONDITION): the items of that request are then resent
through each table's own router, which refreshes its slot map and reaches the
new owners — the rare path stays the well-tested single-table one.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recstore.client.backends.node_calls import NodeCalls
from recstore.client.backends.remote_rows import pull_issue, update_issue
from recstore.client.errors import BackendError
from recstore.client.fanout import Positions, ShardRequest, plan_requests
from recstore.core import InvalidArgument, SlotMap, WrongShard, slot_of, wire

NodeOf = Callable[[str], NodeCalls]  # endpoint -> its node


@dataclass
class TableCall:
    """One table's share of a multi call: ``rows`` is the pull's output or the update's grads."""

    table: Any  # the backend's record of the table: .spec, .endpoints, .router
    keys: np.ndarray
    rows: np.ndarray
    lr: float | None = None
    every_shard: bool = False  # adam: every shard sees every step

    @property
    def name(self) -> str:
        return str(self.table.spec.name)


@dataclass(frozen=True)
class Part:
    index: int  # which TableCall
    positions: Positions  # into that table's keys
    epoch: int


@dataclass
class _Batch:
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
    """``fanout.plan_requests`` with a faster split for the usual few shards (same result)."""
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


def plan_batches(calls: Sequence[TableCall], max_bytes: int) -> list[_Batch]:
    """Requests per node: every table's parts for that node, cut at ``max_bytes`` of rows."""
    open_batches: dict[str, _Batch] = {}
    batches: list[_Batch] = []
    for index, call in enumerate(calls):
        slot_map, row_bytes = call.table.router.slot_map, call.table.spec.row_bytes
        max_rows = max(1, max_bytes // row_bytes)
        for request in table_requests(call.keys, slot_map, max_rows, call.every_shard):
            endpoint = call.table.endpoints[request.shard]
            size = len(request.positions) * row_bytes
            batch = open_batches.get(endpoint)
            if batch is None or (batch.parts and batch.size + size > max_bytes):
                batch = open_batches[endpoint] = _Batch(endpoint)
                batches.append(batch)
            batch.parts.append(Part(index, request.positions, slot_map.epoch))
            batch.size += size
    return batches


def _encode_pull(calls: Sequence[TableCall], parts: list[Part]) -> bytes:
    return wire.encode_multi_pull_request(
        wire.PullRequest(calls[p.index].name, p.epoch, calls[p.index].keys[p.positions].data)
        for p in parts
    )


def _encode_update(calls: Sequence[TableCall], parts: list[Part]) -> bytes:
    items = []
    for p in parts:
        call = calls[p.index]
        grads = call.rows[p.positions]
        items.append(
            wire.UpdateRequest(
                call.name, p.epoch, call.keys[p.positions].data, grads.data,
                wire.dtype_name(grads), call.lr, call.table.spec.embedding_dim,
            )
        )  # fmt: skip
    return wire.encode_multi_update_request(items)


class MultiCall:
    """The requests of one multi-table call, all sent at construction; collected once.

    Thread-safe and idempotent like the single-table ``RoutedCall``: whoever
    waits first collects every reply (and resends refused items); a failure is
    kept per table, so each table reports only what happened to its own rows.
    """

    def __init__(
        self, method: str, calls: Sequence[TableCall], node: NodeOf, max_bytes: int, *,
        blocking: bool,
    ) -> None:  # fmt: skip
        if method not in ("MultiPull", "MultiUpdate"):
            raise ValueError(f"not a multi-table method: {method!r}")
        self.method, self.calls, self._node = method, list(calls), node
        self._lock = threading.Lock()
        self._collected = False
        self.failures: dict[int, BaseException] = {}
        encode = _encode_pull if method == "MultiPull" else _encode_update
        batches = plan_batches(self.calls, max_bytes)
        self._sent: list[tuple[_Batch, Callable[[], bytes]]] = []
        for number, batch in enumerate(batches):
            label = ", ".join(dict.fromkeys(self.calls[p.index].name for p in batch.parts))
            waiter = node(batch.endpoint).start(
                method, encode(self.calls, batch.parts), label,
                blocking=blocking and number == len(batches) - 1,
            )  # fmt: skip
            self._sent.append((batch, waiter))

    def wait(self) -> None:
        """Every reply in; raises the first failure of any table."""
        self._collect()
        for index in sorted(self.failures):
            raise self.failures[index]

    def wait_table(self, index: int) -> None:
        """Every reply in; raises the failure of table ``index`` only."""
        self._collect()
        failure = self.failures.get(index)
        if failure is not None:
            raise failure

    def share(self, index: int) -> TableShare:
        return TableShare(self, index)

    def _collect(self) -> None:
        with self._lock:
            if self._collected:
                return
            for batch, waiter in self._sent:  # wait for all: nothing runs behind the caller
                try:
                    self._finish(batch, waiter())
                except WrongShard:
                    for part in batch.parts:
                        self._guarded(part, functools.partial(self._resend, part))
                except BaseException as error:
                    for part in batch.parts:
                        self.failures.setdefault(part.index, error)
            self._sent = []
            self._collected = True

    def _guarded(self, part: Part, run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException as error:
            self.failures.setdefault(part.index, error)

    def _finish(self, batch: _Batch, raw: bytes) -> None:
        try:
            if self.method == "MultiUpdate":
                replies: list[Any] = wire.decode_multi_rows_response(raw)
            else:
                replies = wire.decode_multi_pull_response(raw)
            if len(replies) != len(batch.parts):
                raise InvalidArgument(f"{len(replies)} items for {len(batch.parts)} asked")
            if self.method == "MultiPull":
                for part, reply in zip(batch.parts, replies, strict=True):
                    self._store_rows(part, reply)
        except InvalidArgument as error:
            raise BackendError(
                f"PS node {batch.endpoint} answered a malformed {self.method} reply: {error}",
                code="DATA_LOSS",
            ) from error

    def _store_rows(self, part: Part, reply: wire.PullResponse) -> None:
        call = self.calls[part.index]
        dim, count = call.table.spec.embedding_dim, len(part.positions)
        if count and (reply.dim != dim or wire.wire_dtype(reply.dtype) != call.rows.dtype):
            raise InvalidArgument(
                f"table {call.name!r}: rows of dim {reply.dim} {reply.dtype!r}, the table has "
                f"dim {dim}"
            )
        call.rows[part.positions] = wire.rows_view(
            reply.values, count, dim, reply.dtype or "float32"
        )

    def _resend(self, part: Part) -> None:
        """One refused item through its table's router (refresh, then the new owners)."""
        call = self.calls[part.index]
        table, keys = call.table, np.ascontiguousarray(call.keys[part.positions])

        def node_of(shard: int) -> NodeCalls:
            return self._node(table.endpoints[shard])

        if self.method == "MultiPull":
            out = np.empty((len(keys), table.spec.embedding_dim), dtype=call.rows.dtype)
            table.router.start(keys, pull_issue(table.spec, keys, out, node_of)).wait()
            call.rows[part.positions] = out
        else:
            grads = np.ascontiguousarray(call.rows[part.positions])
            issue = update_issue(table.spec, keys, grads, call.lr, node_of)
            table.router.start(keys, issue).wait()


@dataclass(frozen=True)
class TableShare:
    """One table's completion of a multi update, for ``PendingUpdates``."""

    call: MultiCall
    index: int

    def wait(self) -> object:
        self.call.wait_table(self.index)
        return None
