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


@dataclass
class CarryPlan:
    """Pull requests per node, each carrying that node's share of some updates."""

    batches: list[_Batch]  # the pulls; a node with only updates gets an empty batch
    carried: dict[str, _Batch]  # endpoint -> update parts it carries


def plan_carrying(
    pulls: Sequence[TableCall], updates: Sequence[TableCall], max_bytes: int
) -> CarryPlan | None:
    """Each node's updates riding on its one pull request; None when they do not fit.

    Updates may only ride on a node's single request (two requests to a node run
    in no particular order) and within the byte bound; otherwise the caller sends
    them first, on their own.
    """
    batches = plan_batches(pulls, max_bytes)
    carried: dict[str, _Batch] = {}
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
    batches += [_Batch(endpoint) for endpoint in carried if endpoint not in pull_requests]
    return CarryPlan(batches, carried)


def _pull_items(calls: Sequence[TableCall], parts: list[Part]) -> list[wire.PullRequest]:
    return [
        wire.PullRequest(calls[p.index].name, p.epoch, calls[p.index].keys[p.positions].data)
        for p in parts
    ]


def _update_items(calls: Sequence[TableCall], parts: list[Part]) -> list[wire.UpdateRequest]:
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
    return items


class MultiCall:
    """The requests of one multi-table call, all sent at construction; collected once.

    Thread-safe and idempotent like the single-table ``RoutedCall``: whoever
    waits first collects every reply (and resends refused items); a failure is
    kept per table, so each table reports only what happened to its own rows.
    A MultiPull may carry updates (``carried``, planned by ``plan_carrying``):
    the node applies them before it pulls, and their failures are kept apart.
    """

    def __init__(
        self, method: str, calls: Sequence[TableCall], node: NodeOf, max_bytes: int, *,
        blocking: bool, carried: Sequence[TableCall] = (), plan: CarryPlan | None = None,
    ) -> None:  # fmt: skip
        if method not in ("MultiPull", "MultiUpdate"):
            raise ValueError(f"not a multi-table method: {method!r}")
        if carried and (method != "MultiPull" or plan is None):
            raise ValueError("only a MultiPull carries updates, with its plan_carrying plan")
        self.method, self.calls, self._node = method, list(calls), node
        self.carried = list(carried)
        self._lock = threading.Lock()
        self._collected = False
        self.failures: dict[int, BaseException] = {}
        self.carried_failures: dict[int, BaseException] = {}
        batches = plan.batches if plan is not None else plan_batches(self.calls, max_bytes)
        riding = plan.carried if plan is not None else {}
        self._sent: list[tuple[_Batch, _Batch | None, Callable[[], bytes]]] = []
        for number, batch in enumerate(batches):
            extra = riding.get(batch.endpoint)
            if method == "MultiPull":
                request = wire.encode_multi_pull_request(
                    _pull_items(self.calls, batch.parts),
                    _update_items(self.carried, extra.parts) if extra else (),
                )
            else:
                request = wire.encode_multi_update_request(_update_items(self.calls, batch.parts))
            names = [self.calls[p.index].name for p in batch.parts]
            names += [self.carried[p.index].name for p in extra.parts] if extra else []
            waiter = node(batch.endpoint).start(
                method, request, ", ".join(dict.fromkeys(names)),
                blocking=blocking and number == len(batches) - 1,
            )  # fmt: skip
            self._sent.append((batch, extra, waiter))

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

    def wait_carried(self, index: int) -> None:
        """Every reply in; raises the failure of carried update ``index`` only."""
        self._collect()
        failure = self.carried_failures.get(index)
        if failure is not None:
            raise failure

    def share(self, index: int) -> TableShare:
        return TableShare(self, index)

    def carried_share(self, index: int) -> CarriedShare:
        return CarriedShare(self, index)

    def _collect(self) -> None:
        with self._lock:
            if self._collected:
                return
            for batch, extra, waiter in self._sent:  # wait for all: nothing runs behind the caller
                carried_parts = extra.parts if extra else []
                try:
                    self._finish(batch, len(carried_parts), waiter())
                except WrongShard:  # refused whole, nothing applied: updates first, then pulls
                    for part in carried_parts:
                        self._guarded(
                            part, self.carried_failures,
                            functools.partial(self._resend, part, self.carried, "MultiUpdate"),
                        )  # fmt: skip
                    for part in batch.parts:
                        self._guarded(
                            part, self.failures,
                            functools.partial(self._resend, part, self.calls, self.method),
                        )  # fmt: skip
                except BaseException as error:
                    for part in batch.parts:
                        self.failures.setdefault(part.index, error)
                    if not (isinstance(error, BackendError) and error.code == "ABORTED"):
                        for part in carried_parts:  # ABORTED: the node applied them
                            self.carried_failures.setdefault(part.index, error)
            self._sent = []
            self._collected = True

    @staticmethod
    def _guarded(part: Part, failures: dict[int, BaseException], run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException as error:
            failures.setdefault(part.index, error)

    def _finish(self, batch: _Batch, carried: int, raw: bytes) -> None:
        try:
            if self.method == "MultiUpdate":
                replies: list[Any] = wire.decode_multi_rows_response(raw)
                applied: list[int] = []
            else:
                replies, applied = wire.decode_multi_pull_reply(raw)
            if len(replies) != len(batch.parts) or len(applied) != carried:
                raise InvalidArgument(
                    f"{len(replies)} items and {len(applied)} carried updates answered, "
                    f"{len(batch.parts)} and {carried} sent"
                )
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

    def _resend(self, part: Part, calls: Sequence[TableCall], method: str) -> None:
        """One refused item through its table's router (refresh, then the new owners)."""
        call = calls[part.index]
        table, keys = call.table, np.ascontiguousarray(call.keys[part.positions])

        def node_of(shard: int) -> NodeCalls:
            return self._node(table.endpoints[shard])

        if method == "MultiPull":
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


@dataclass(frozen=True)
class CarriedShare:
    """One carried update's completion, for ``PendingUpdates``."""

    call: MultiCall
    index: int

    def wait(self) -> object:
        self.call.wait_carried(self.index)
        return None
