"""A training step's multi-table traffic: its pulls, the updates riding on them, lookahead.

Updates a backward hands over are held and ride on the next MultiPull
(``recstore.client.carry``); the node applies them before it pulls. Lookahead
goes one step further: when the trainer names the next batch's pulls before
this step's backward (``EmbeddingBagCollection.prefetch``), they go out with
this step's gradients the moment backward hands them over, so the round trip
overlaps the rest of the step (the rest of backward, the optimizer step, the
next forward's dense layers) instead of stalling the next forward. Results
stay exact: the node applies the gradients before it pulls, and anything
else that happens in between — another update, a push, any other call on the
client — makes the prefetched rows stale, so the next forward pulls afresh
(the carried updates still land, tracked as in flight like any other).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from recstore.client.backends import wire
from recstore.client.backends.base import PullRequest
from recstore.client.backends.multi_requests import TableCall, build_requests
from recstore.client.backends.multi_rows import MultiCall
from recstore.client.carry import CarriedUpdates
from recstore.client.pending import PendingUpdates
from recstore.core import DType


@dataclass
class _Pull:
    """One multi-table pull in flight (its replies not collected yet)."""

    requests: list[PullRequest]
    call: MultiCall
    calls: list[TableCall]
    inverses: list[torch.Tensor | None]
    carried: list[TableCall] = field(default_factory=list)
    stale: bool = False  # something happened since it was sent: its rows are not used


def _same(sent: Sequence[PullRequest], asked: Sequence[PullRequest]) -> bool:
    if len(sent) != len(asked):
        return False
    for (name, keys, unique), (asked_name, asked_keys, asked_unique) in zip(
        sent, asked, strict=True
    ):
        if name != asked_name or unique != asked_unique:
            return False
        if keys is not asked_keys and not torch.equal(keys, asked_keys):
            return False
    return True


class StepPulls:
    def __init__(
        self,
        *,
        locate: Callable[[str], Any],
        node: Callable[[str], Any],
        max_bytes: Callable[[], int],
        pending: PendingUpdates,
        carried: CarriedUpdates[TableCall] | None,
        send_updates: Callable[[list[TableCall]], None],
    ) -> None:
        self._locate, self._node, self._max_bytes = locate, node, max_bytes
        self._pending, self._carried, self._send_updates = pending, carried, send_updates
        self._lookahead: list[PullRequest] | None = None
        self._prefetched: _Pull | None = None

    # -- the forward -------------------------------------------------------------------
    def pull_many(self, requests: Sequence[PullRequest]) -> list[torch.Tensor]:
        """The rows of ``requests``: prefetched ones when they still hold, else pulled now."""
        requests = list(requests)
        if self._carried is None:
            return self._finish(self._start(requests, [], blocking=True))
        with self._carried.lock:
            self._lookahead = None  # named but never sent: this forward asks itself
            prefetched, self._prefetched = self._prefetched, None
            if prefetched is not None and not prefetched.stale:
                if _same(prefetched.requests, requests):
                    ready = prefetched
                else:
                    prefetched.stale, ready = True, None
            else:
                ready = None
            if ready is None:
                pull = self._start(requests, self._carried.take(), blocking=True)
        # (A stale prefetch's updates are tracked as in flight: the tables pulled now
        # waited for theirs in ``_start``; the others report at their next call.)
        return self._finish(ready if ready is not None else pull)

    # -- the gradient handoff ------------------------------------------------------------
    def updates_ready(self, calls: list[TableCall]) -> None:
        """A backward's updates: sent now with the named next pulls, else held to ride."""
        if self._carried is None:
            self._send_updates(calls)
            return
        with self._carried.lock:
            if self._prefetched is not None:
                self._prefetched.stale = True  # its rows predate these updates
            if self._lookahead is not None:
                requests, self._lookahead = self._lookahead, None
                if self._prefetched is None:  # held ones first: a table's updates stay in order
                    carried = self._carried.take() + calls
                    self._prefetched = self._start(requests, carried, blocking=False)
                    return
            self._carried.hold(calls)

    # -- lookahead ---------------------------------------------------------------------
    def lookahead(self, requests: Sequence[PullRequest]) -> None:
        """Name the next forward's pulls: sent with the next updates (or now, with held ones)."""
        if self._carried is None:
            return  # updates are not carried: nothing to ride on, the forward pulls
        with self._carried.lock:
            if self._prefetched is not None:
                self._prefetched.stale = True
                return  # one lookahead at a time: the next forward settles the last one
            held = self._carried.take()
            if held:
                self._prefetched = self._start(list(requests), held, blocking=False)
            else:
                self._lookahead = list(requests)

    def cancel(self) -> None:
        """Another call on the client: named pulls are dropped, prefetched rows go stale."""
        if self._carried is None:
            return
        with self._carried.lock:
            self._lookahead = None
            if self._prefetched is not None:
                self._prefetched.stale = True

    # -- one pull ------------------------------------------------------------------------
    def _start(
        self, requests: list[PullRequest], carried: list[TableCall], *, blocking: bool
    ) -> _Pull:
        try:
            calls, inverses, built = self._prepare(requests, carried)
        except BaseException:
            if carried:  # this pull cannot go out: its passengers still must
                self._send_updates(carried)
            raise
        if built is None:  # too big to ride: send them first, on their own
            self._send_updates(carried)
            carried = []
            self._pending.settle_tables(name for name, _, _ in requests)
            built = build_requests("MultiPull", calls, self._max_bytes())
        assert built is not None
        call = MultiCall("MultiPull", calls, self._node, built, blocking=blocking, carried=carried)
        for index, update in enumerate(carried):  # in flight until the reply is in
            self._pending.add(update.name, call.carried_share(index))
        return _Pull(requests, call, calls, inverses, carried)

    def _prepare(
        self, requests: list[PullRequest], carried: list[TableCall]
    ) -> tuple[list[TableCall], list[torch.Tensor | None], Any]:
        """Each table's call and inverse, and the requests (None: the updates cannot ride)."""
        # updates sent earlier (held ones are in ``carried``)
        self._pending.settle_tables(name for name, _, _ in requests)
        calls, inverses = [], []
        for name, keys, unique in requests:
            table = self._locate(name)
            distinct, inverse = (keys, None) if unique else torch.unique(keys, return_inverse=True)
            keys_np = wire.keys_to_numpy(distinct)
            dtype = wire.wire_dtype(DType(table.spec.dtype))
            out = np.empty((len(keys_np), table.spec.embedding_dim), dtype=dtype)
            calls.append(TableCall(table, keys_np, out))
            inverses.append(inverse)
        return calls, inverses, build_requests("MultiPull", calls, self._max_bytes(), carried)

    def _finish(self, pull: _Pull) -> list[torch.Tensor]:
        try:
            pull.call.wait()
        except BaseException:
            self._settle_carried(pull, failed=True)
            raise
        self._settle_carried(pull, failed=False)
        results = []
        for table_call, inverse in zip(pull.calls, pull.inverses, strict=True):
            rows = wire.rows_from_numpy(table_call.rows, DType(table_call.table.spec.dtype))
            results.append(rows if inverse is None else rows[inverse])
        return results

    def _settle_carried(self, pull: _Pull, *, failed: bool) -> None:
        """Report a carried update's failure now when this pull read its table (its next call).

        After a failed pull its error says it all; other tables report theirs later.
        """
        pulled = {name for name, _, _ in pull.requests}
        for update in pull.carried:
            if update.name not in pulled:
                continue
            try:
                self._pending.settle(update.name)
            except Exception:
                if not failed:
                    raise
