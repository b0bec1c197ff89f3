"""Several tables' rows in one request per PS node: MultiPull and MultiUpdate.

A training step over many tables would otherwise send one Pull and one Update
per table and shard, and on a Python node each RPC costs far more than the
rows it moves. Every table's keys are routed by that table's own slot map,
the (table, shard) parts are grouped by node, and each node gets one request
(``requests``; cut into several only past the batch byte bound). Pulled
rows are checked and copied straight into each table's output array, as
single pulls do. A node refuses a request whole, applying nothing, when it no longer owns
some slots (FAILED_PRECONDITION): the items of that request are then resent
through each table's own router, which refreshes its slot map and reaches the
new owners — the rare path stays the well-tested single-table one.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from recstore import _native as _native_module
from recstore.client.errors import BackendError
from recstore.client.remote.nodes import TABLES_SEPARATOR, NodeCalls
from recstore.client.remote.requests import Part, Request, TableCall
from recstore.client.remote.single_table import pull_issue, update_issue
from recstore.core import InvalidArgument, WrongShard

#: the compiled codec (no type stubs)
_native: Any = _native_module

NodeOf = Callable[[str], NodeCalls]  # endpoint -> its node


class MultiCall:
    """The requests of one multi-table call, all sent at construction; collected once.

    Thread-safe and idempotent like the single-table ``RoutedCall``: whoever
    waits first collects every reply (and resends refused items); a failure is
    kept per table, so each table reports only what happened to its own rows.
    A MultiPull may carry updates (``carried``, planned by ``encode_multi``):
    the node applies them before it pulls, and their failures are kept apart.
    A MultiPull's replies carry each table's version on each node: ``versions``
    (per table call: node -> the oldest version its replies reported); a table
    whose items had to be resent after a slot-map change is in ``resent``.
    """

    def __init__(
        self, method: str, calls: Sequence[TableCall], node: NodeOf, requests: list[Request], *,
        blocking: bool, carried: Sequence[TableCall] = (),
    ) -> None:  # fmt: skip
        self.method, self.calls, self._node = method, list(calls), node
        self.carried = list(carried)
        self._lock = threading.Lock()
        self._collected = False
        self.failures: dict[int, BaseException] = {}
        self.carried_failures: dict[int, BaseException] = {}
        self.versions: list[dict[str, int]] = [{} for _ in self.calls]
        self.resent: set[int] = set()
        self._sent: list[tuple[Request, Callable[[], bytes]]] = []
        for request in requests:
            names = [self.calls[p.index].name for p in request.parts]
            names += [self.carried[p.index].name for p in request.carried]
            waiter = node(request.endpoint).start(
                method, request.body, TABLES_SEPARATOR.join(dict.fromkeys(names)),
                blocking=False, waited=blocking,
                writes=method == "MultiUpdate" or bool(request.carried),
            )  # fmt: skip
            self._sent.append((request, waiter))

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
            for request, waiter in self._sent:  # wait for all: nothing runs behind the caller
                try:
                    self._finish(request, waiter())
                except WrongShard:  # refused whole, nothing applied: updates first, then pulls
                    for part in request.carried:
                        self._guarded(
                            part, self.carried_failures,
                            functools.partial(self._resend, part, self.carried, "MultiUpdate"),
                        )  # fmt: skip
                    for part in request.parts:
                        self._guarded(
                            part, self.failures,
                            functools.partial(self._resend, part, self.calls, self.method),
                        )  # fmt: skip
                except BaseException as error:
                    for part in request.parts:
                        self.failures.setdefault(part.index, error)
                    if not (
                        isinstance(error, BackendError) and error.status is grpc.StatusCode.ABORTED
                    ):
                        for part in request.carried:  # ABORTED: the node applied them
                            self.carried_failures.setdefault(part.index, error)
            self._sent = []
            self._collected = True

    @staticmethod
    def _guarded(part: Part, failures: dict[int, BaseException], run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException as error:
            failures.setdefault(part.index, error)

    def _finish(self, request: Request, raw: bytes) -> None:
        try:
            if self.method == "MultiUpdate":
                _native.parse_rows_reply(raw, len(request.parts))
            else:
                assert request.targets is not None  # every MultiPull request has its targets
                _, versions = _native.scatter_pull_reply(raw, request.targets, len(request.carried))
                for part, version in zip(request.parts, versions, strict=True):
                    self._saw_version(part.index, request.endpoint, version)
        except (InvalidArgument, ValueError) as error:
            raise BackendError(
                f"PS node {request.endpoint} answered a malformed {self.method} reply: {error}",
                code=grpc.StatusCode.DATA_LOSS,
            ) from error

    def _saw_version(self, index: int, endpoint: str, version: int) -> None:
        seen = self.versions[index]
        seen[endpoint] = min(seen.get(endpoint, version), version)

    def _resend(self, part: Part, calls: Sequence[TableCall], method: str) -> None:
        """One refused item through its table's router (refresh, then the new owners)."""
        call = calls[part.index]
        table, keys = call.table, np.ascontiguousarray(call.keys[part.positions])

        def node_of(shard: int) -> NodeCalls:
            return self._node(table.endpoints[shard])

        if method == "MultiPull":
            self.resent.add(part.index)  # its versions come from nodes it may not have asked
            out = np.empty((len(keys), table.spec.embedding_dim), dtype=call.rows.dtype)
            issue = pull_issue(table.spec, keys, out, node_of, transport=table.transport)
            table.router.start(keys, issue).wait()
            call.rows[part.positions] = out
        else:
            grads = np.ascontiguousarray(call.rows[part.positions])
            issue = update_issue(table.spec, keys, grads, call.lr, node_of, table.transport)
            table.router.start(keys, issue).wait()


@dataclass(frozen=True)
class TableShare:
    """One table's completion of a multi update, for ``UpdatesInFlight``."""

    call: MultiCall
    index: int

    def wait(self) -> object:
        self.call.wait_table(self.index)
        return None


@dataclass(frozen=True)
class CarriedShare:
    """One carried update's completion, for ``UpdatesInFlight``."""

    call: MultiCall
    index: int

    def wait(self) -> object:
        self.call.wait_carried(self.index)
        return None
