"""Sharded fan-out: split keys by owner shard, call shards in parallel, reassemble.

A table's keys are spread over shards by the slot map of ``recstore.core``
(the same routing the nodes and the operator use). One logical call becomes
one request per (shard, batch): big batches are cut to ``max_rows`` keys so
no message grows without bound, the requests run in parallel on a thread
pool, and the caller gets every result with the positions it belongs to, so
it can put rows back in input order. A node that no longer owns some slots
refuses those keys (``WrongShard``) and applies nothing; the router then
refreshes its map and resends only the refused keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from recstore.core import SlotMap, WrongShard
from recstore.core.routing import split_by_shard

T = TypeVar("T")
Positions = npt.NDArray[np.intp]

#: Rounds of "refresh the slot map and resend the refused keys" before giving up.
MAX_REROUTES = 4


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
    requests: list[ShardRequest] = []
    seen: set[int] = set()
    for shard, positions in split_by_shard(keys, slot_map) if len(keys) else []:
        seen.add(shard)
        step = len(positions) if every_shard else max_rows
        for start in range(0, len(positions), step):
            requests.append(ShardRequest(shard, positions[start : start + max_rows]))
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


class ShardRouter:
    """Routes calls over a table's shards with one slot map, refreshed on demand."""

    def __init__(
        self,
        slot_map: SlotMap,
        pool: Executor,
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

    def run(
        self,
        keys: npt.NDArray[np.int64],
        call: Callable[[int, Positions, int], T],
        *,
        every_shard: bool = False,
    ) -> list[ShardResult[T]]:
        """``call(shard, positions, epoch)`` for every request; results in any order.

        Raises the first failure other than a refused slot once all requests are
        done (so no call is left running behind the caller's back).
        """
        pending = np.arange(len(keys), dtype=np.intp)
        results: list[ShardResult[T]] = []
        for _ in range(MAX_REROUTES + 1):
            slot_map = self._slot_map
            requests = [
                ShardRequest(r.shard, pending[r.positions])
                for r in plan_requests(
                    keys[pending], slot_map, self._max_rows, every_shard=every_shard
                )
            ]
            done, refused = self._execute(requests, call, slot_map.epoch)
            results.extend(done)
            if not refused:
                return results
            pending = np.concatenate([r.positions for r, _ in refused])
            self._reroute(max(error.epoch for _, error in refused), slot_map.epoch)
            every_shard = False
        raise RuntimeError(
            f"keys still refused by their shards after {MAX_REROUTES} slot-map refreshes"
        )

    def _execute(
        self, requests: list[ShardRequest], call: Callable[[int, Positions, int], T], epoch: int
    ) -> tuple[list[ShardResult[T]], list[tuple[ShardRequest, WrongShard]]]:
        if len(requests) == 1:  # no thread hop for the common one-request case
            request = requests[0]
            try:
                return [ShardResult(request, call(request.shard, request.positions, epoch))], []
            except WrongShard as error:
                return [], [(request, error)]
        futures: list[Future[T]] = [
            self._pool.submit(call, r.shard, r.positions, epoch) for r in requests
        ]
        done: list[ShardResult[T]] = []
        refused: list[tuple[ShardRequest, WrongShard]] = []
        failure: BaseException | None = None
        for request, future in zip(requests, futures, strict=True):
            try:
                done.append(ShardResult(request, future.result()))
            except WrongShard as error:
                refused.append((request, error))
            except BaseException as error:
                failure = failure or error
        if failure is not None:
            raise failure
        return done, refused

    def _reroute(self, node_epoch: int, used_epoch: int) -> None:
        if self._refresh is None:
            raise RuntimeError(
                f"a shard refused keys at slot-map epoch {used_epoch} (node epoch {node_epoch}) "
                "and this table has no slot-map source to refresh from"
            )
        with self._lock:
            if self._slot_map.epoch == used_epoch:  # another thread may have refreshed already
                self._slot_map = self._refresh(node_epoch)
