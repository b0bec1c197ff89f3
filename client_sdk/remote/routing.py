"""Sharded fan-out: split keys by owner shard, send every shard's requests at once, reassemble.

A table's keys are spread over shards by the slot map of ``recstore.core``
(the same routing the nodes and the operator use). One logical call becomes
one request per (shard, batch): big batches are cut to ``max_rows`` keys so
no message grows without bound. The caller's ``issue`` function starts a
request and returns a waiter for its result (a gRPC future needs no thread of
its own); every request is issued before any is waited for, and the last one
may run to completion in the caller's thread (``blocking``), so a one-shard
call costs no hand-off at all. A node that no longer owns some slots refuses
those keys (``WrongShard``) and applies nothing; waiting then refreshes the
map and resends only the refused keys.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from recstore.core import SlotMap, WrongShard
from recstore.core.routing import split_by_shard

T = TypeVar("T")
Positions = npt.NDArray[np.intp]
Waiter = Callable[[], T]
#: ``issue(shard, positions, epoch, blocking)``: start one request; a waiter for its result
Issue = Callable[[int, Positions, int, bool], Waiter[T]]

#: Rounds of "refresh the slot map and resend the refused keys" before giving up.
MAX_REROUTES = 4
#: How long refused keys wait for nodes behind the client's slot map to catch up, and
#: a refresh for an unreachable slot-map source (the admin API restarting): a platform
#: restarted on a busy machine can take over a minute to bring its nodes back.
BEHIND_WAIT_S = 180.0


@dataclass(frozen=True)
class ShardRequest:
    shard: int
    positions: Positions  # indices into the caller's key array


def plan_requests(
    keys: npt.NDArray[np.int64], slot_map: SlotMap, max_rows: int, *, every_shard: bool = False
) -> list[ShardRequest]:
    """One request per owner shard and batch of at most ``max_rows`` keys.

    ``every_shard`` asks for exactly one request per shard, empty where a shard
    owns none of the keys, never split: optimizers whose state advances on every
    call (adam's per-table step count) must see each step once on each shard.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if slot_map.num_shards == 1 and (every_shard or len(keys) <= max_rows):
        return [ShardRequest(0, np.arange(len(keys), dtype=np.intp))] if (
            len(keys) or every_shard
        ) else []  # fmt: skip
    requests: list[ShardRequest] = []
    seen: set[int] = set()
    for shard, positions in split_by_shard(keys, slot_map) if len(keys) else []:
        seen.add(shard)
        step = len(positions) if every_shard else max_rows
        for start in range(0, len(positions), step):
            requests.append(ShardRequest(shard, positions[start : start + step]))
    if every_shard:
        empty = np.empty(0, dtype=np.intp)
        requests.extend(
            ShardRequest(shard, empty) for shard in range(slot_map.num_shards) if shard not in seen
        )
    return requests


@dataclass
class ShardResult(Generic[T]):
    request: ShardRequest
    value: T


def completed(call: Callable[[], T]) -> Waiter[T]:
    """Run ``call`` now; a waiter that returns its value or raises its error."""
    try:
        value = call()
    except BaseException as error:  # re-raised by the waiter, where results are collected
        caught = error

        def fail() -> T:
            raise caught

        return fail
    return lambda: value


class RoutedCall(Generic[T]):
    """The requests of one logical call, already sent; ``wait`` collects them once.

    Thread-safe and idempotent: whoever waits first does the work (including
    resending refused keys), later waiters get the same results or error.
    """

    def __init__(
        self, router: ShardRouter, keys: npt.NDArray[np.int64], issue: Issue[T], *,
        every_shard: bool, blocking: bool,
    ) -> None:  # fmt: skip
        self._router, self._keys, self._issue = router, keys, issue
        self._lock = threading.Lock()
        self._results: list[ShardResult[T]] | None = None
        self._error: BaseException | None = None
        self._epoch = router.slot_map.epoch
        self._sent = router.send(
            keys, np.arange(len(keys), dtype=np.intp), issue, every_shard, blocking
        )

    def wait(self) -> list[ShardResult[T]]:
        """Every result (in any order); raises the first failure other than a refused slot."""
        with self._lock:
            if self._results is None and self._error is None:
                try:
                    self._results = self._collect()
                except BaseException as error:
                    self._error = error
                finally:
                    self._sent = []
            if self._error is not None:
                raise self._error
            assert self._results is not None
            return self._results

    def _collect(self) -> list[ShardResult[T]]:
        results: list[ShardResult[T]] = []
        sent, epoch = self._sent, self._epoch
        behind = Patience(BEHIND_WAIT_S)
        rerouted = 0
        while True:
            refused: list[tuple[ShardRequest, WrongShard]] = []
            failure: BaseException | None = None
            for request, waiter in sent:  # wait for all, so nothing runs behind the caller
                try:
                    results.append(ShardResult(request, waiter()))
                except WrongShard as error:
                    refused.append((request, error))
                except BaseException as error:
                    failure = failure or error
            if failure is not None:
                raise failure
            if not refused:
                return results
            pending = np.concatenate([r.positions for r, _ in refused])
            node_epoch = max(error.epoch for _, error in refused)
            if node_epoch < epoch and behind.wait():
                pass  # the new owner is not activated yet (a move's commit): same map again
            elif rerouted < MAX_REROUTES:
                self._router.reroute(node_epoch, epoch)
                if self._router.slot_map.epoch != epoch:
                    rerouted += 1
                    epoch = self._router.slot_map.epoch
                elif not behind.wait():
                    # the map's source has nothing newer: the slots are held by a move
                    # (sealed, or a restarted source still sealed until the move is
                    # finished or aborted) for longer than a client waits
                    raise RuntimeError(
                        f"keys still refused by their shards at slot-map epoch {epoch} after "
                        f"{BEHIND_WAIT_S:g} s: their slots are held by a move that did not end"
                    )
            else:  # every request sent was collected: nothing runs behind the caller
                raise RuntimeError(
                    f"keys still refused by their shards after {MAX_REROUTES} slot-map refreshes"
                )
            sent = self._router.send(self._keys, pending, self._issue, False, True)


class Patience:
    """Growing pauses (up to 1 s) for at most ``limit_s``: while the nodes that refused
    keys are behind the client's slot map (they learn it when the move activates it; a
    restarted node may take seconds), or while the map's source restarts."""

    def __init__(self, limit_s: float) -> None:
        self._deadline = time.monotonic() + limit_s
        self._pause = 0.02

    def wait(self) -> bool:
        """Pause once; False once the limit has passed (then the caller gives up)."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(self._pause, left))
        self._pause = min(2 * self._pause, 1.0)
        return True


class ShardRouter:
    """Routes calls over a table's shards with one slot map, refreshed on demand."""

    def __init__(
        self,
        slot_map: SlotMap,
        pool: Executor | None = None,
        *,
        max_rows: int,
        refresh: Callable[[int], SlotMap] | None = None,
    ) -> None:
        self._slot_map = slot_map
        self._pool = pool
        self._max_rows = max_rows
        self._refresh = refresh
        self._lock = threading.Lock()

    @property
    def slot_map(self) -> SlotMap:
        return self._slot_map

    def start(
        self,
        keys: npt.NDArray[np.int64],
        issue: Issue[T],
        *,
        every_shard: bool = False,
        blocking: bool = True,
    ) -> RoutedCall[T]:
        """Send every request of ``keys`` now; ``blocking=False`` leaves all of them in flight."""
        return RoutedCall(self, keys, issue, every_shard=every_shard, blocking=blocking)

    def run(
        self,
        keys: npt.NDArray[np.int64],
        call: Callable[[int, Positions, int], T],
        *,
        every_shard: bool = False,
    ) -> list[ShardResult[T]]:
        """``call(shard, positions, epoch)`` (a blocking function) for every request, on the pool.

        Raises the first failure other than a refused slot once all requests are
        done (so no call is left running behind the caller's back).
        """
        pool = self._pool

        def issue(shard: int, positions: Positions, epoch: int, blocking: bool) -> Waiter[T]:
            if blocking or pool is None:
                return completed(lambda: call(shard, positions, epoch))
            return pool.submit(call, shard, positions, epoch).result

        return self.start(keys, issue, every_shard=every_shard).wait()

    def send(
        self,
        keys: npt.NDArray[np.int64],
        pending: Positions,
        issue: Issue[T],
        every_shard: bool,
        blocking: bool,
    ) -> list[tuple[ShardRequest, Waiter[T]]]:
        """Issue the requests of ``keys[pending]``; the last one blocking when asked."""
        slot_map = self._slot_map
        requests = plan_requests(
            keys[pending] if len(pending) != len(keys) else keys,
            slot_map,
            self._max_rows,
            every_shard=every_shard,
        )
        if len(pending) != len(keys):
            requests = [ShardRequest(r.shard, pending[r.positions]) for r in requests]
        last = len(requests) - 1
        return [
            (r, issue(r.shard, r.positions, slot_map.epoch, blocking and i == last))
            for i, r in enumerate(requests)
        ]

    def reroute(self, node_epoch: int, used_epoch: int) -> None:
        if self._refresh is None:
            raise RuntimeError(
                f"a shard refused keys at slot-map epoch {used_epoch} (node epoch {node_epoch}) "
                "and this table has no slot-map source to refresh from"
            )
        with self._lock:
            if self._slot_map.epoch == used_epoch:  # another thread may have refreshed already
                self._slot_map = self._refresh(node_epoch)
