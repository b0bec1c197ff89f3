"""A training step's traffic: its pulls, the updates riding on them, lookahead — one lock.

``Step`` owns everything that orders a client's reads against its writes:
the updates held to ride on the next pull, the updates in flight
(``recstore.client.remote.updates``), the next step's pulls named early, and
the one lock all of them share. The backend asks it to settle a table before
any other call on it, and hands it every update it does not wait for.

Updates a backward hands over are held and ride on the next MultiPull; the
node applies them before it pulls. Lookahead
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

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from recstore.client.backends.base import PullRequest
from recstore.client.remote.nodes import NodeCalls
from recstore.client.remote.replies import MultiCall
from recstore.client.remote.requests import Request, TableCall, build_requests
from recstore.client.remote.tables import RemoteTable
from recstore.client.remote.updates import Completion, HeldUpdates, UpdatesInFlight
from recstore.client.tensors import distinct_keys, keys_to_numpy, rows_from_numpy, spread
from recstore.core import DType, wire


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


class Step:
    """A client's held and in-flight updates and its step pulls, under one lock.

    ``carry_delay`` of 0 sends every update at once (nothing is held).
    """

    def __init__(
        self,
        *,
        locate: Callable[[str], RemoteTable],
        node: Callable[[str], NodeCalls],
        max_bytes: Callable[[], int],
        carry_delay: float,
        max_in_flight: int,
    ) -> None:
        self._locate, self._node, self._max_bytes = locate, node, max_bytes
        self.lock = threading.RLock()
        self._pending = UpdatesInFlight(self.lock, max_in_flight)
        self._carried: HeldUpdates[TableCall] | None = (
            HeldUpdates(self.send_updates, carry_delay, self.lock) if carry_delay > 0 else None
        )
        self._lookahead: list[PullRequest] | None = None
        self._prefetched: _Pull | None = None

    # -- what every other call does first ------------------------------------------------
    def settle(self, names: Sequence[str]) -> None:
        """Before any call of its own on ``names``: held updates go, prefetched rows go stale,
        and each table's update in flight is waited for (its failure raised, once)."""
        self.cancel()
        self.release()
        self._pending.settle_tables(names)

    def settle_in_flight(self, names: Sequence[str]) -> None:
        """Wait for each table's update in flight (the step's own calls: nothing else changes)."""
        self._pending.settle_tables(names)

    def release(self) -> None:
        """Send the held updates now."""
        if self._carried is not None:
            self._carried.release()

    def settle_all(self) -> None:
        """Every update sent and collected; raise the first failure not yet reported."""
        self.release()
        self._pending.settle_all()

    def forget(self, name: str) -> None:
        """Before ``name`` is dropped: everything of ours is collected; its failure no longer
        matters."""
        self.cancel()
        self.release()
        self._pending.wait_all()
        self._pending.discard(name)

    @property
    def updates_in_flight(self) -> int:
        """Updates held or sent whose outcome nobody has collected yet."""
        with self.lock:  # held ones move to in flight under this lock: count both at once
            return len(self._pending) + (len(self._carried) if self._carried is not None else 0)

    def close(self) -> None:
        """Send what is held, stop the timer, collect everything."""
        if self._carried is not None:
            self._carried.close()
        self._pending.settle_all()

    # -- sending -------------------------------------------------------------------------
    def multi_call(self, method: str, calls: list[TableCall], *, blocking: bool) -> MultiCall:
        """A multi-table call (nothing carried) sent now."""
        built = build_requests(method, calls, self._max_bytes())
        assert built is not None  # only carried updates can fail to fit
        return MultiCall(method, calls, self._node, built, blocking=blocking)

    def send_updates(self, calls: list[TableCall]) -> None:
        """Send a multi-table update now and track it per table as in flight."""
        try:
            call = self.multi_call("MultiUpdate", calls, blocking=False)
        except Exception as error:  # e.g. closed meanwhile: each table reports it
            for table_call in calls:
                self._pending.add(table_call.name, _Failed(error))
            return
        for index, table_call in enumerate(calls):
            self._pending.add(table_call.name, call.share(index))

    def track(self, name: str, update: Completion) -> None:
        """A single-table update sent without waiting (``GrpcBackend.update(wait=False)``)."""
        self._pending.add(name, update)

    # -- the forward -------------------------------------------------------------------
    def pull_many(self, requests: Sequence[PullRequest]) -> list[torch.Tensor]:
        """The rows of ``requests``: prefetched ones when they still hold, else pulled now."""
        requests = list(requests)
        if self._carried is None:
            return self._finish(self._start(requests, [], blocking=True))
        with self.lock:
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
            self.send_updates(calls)
            return
        with self.lock:
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
        with self.lock:
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
        with self.lock:
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
                self.send_updates(carried)
            raise
        if built is None:  # too big to ride: send them first, on their own
            self.send_updates(carried)
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
    ) -> tuple[list[TableCall], list[torch.Tensor | None], list[Request] | None]:
        """Each table's call and inverse, and the requests (None: the updates cannot ride)."""
        # updates sent earlier (held ones are in ``carried``)
        self._pending.settle_tables(name for name, _, _ in requests)
        calls, inverses = [], []
        for name, keys, unique in requests:
            table = self._locate(name)
            distinct, inverse = (keys, None) if unique else distinct_keys(keys)
            keys_np = keys_to_numpy(distinct)
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
        for (_, keys, unique), table_call, inverse in zip(
            pull.requests, pull.calls, pull.inverses, strict=True
        ):
            rows = rows_from_numpy(table_call.rows, DType(table_call.table.spec.dtype))
            results.append(rows if unique else spread(rows, inverse, keys.shape))
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


@dataclass(frozen=True)
class _Failed:
    """An update that could not even be sent: its table reports ``error``."""

    error: BaseException

    def wait(self) -> object:
        raise self.error
