"""Sharded fan-out: every key reaches its owner shard once, results come back in input order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from recstore.client.remote import routing
from recstore.client.remote.routing import MAX_REROUTES, ShardRouter, plan_requests
from recstore.core import NUM_SLOTS, SlotMap, SlotRange, WrongShard


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


@pytest.mark.parametrize(
    ("num_keys", "shards", "max_rows"),
    [(0, 1, 10), (1, 1, 10), (100, 1, 7), (1000, 3, 50), (1000, 4, 1000), (17, 8, 1)],
)
def test_plan_covers_each_key_once_on_its_owner(num_keys: int, shards: int, max_rows: int) -> None:
    keys = np.random.default_rng(0).integers(-(2**40), 2**40, num_keys)
    slot_map = SlotMap.initial(shards)
    requests = plan_requests(keys, slot_map, max_rows)
    positions = np.concatenate([r.positions for r in requests]) if requests else np.empty(0)
    assert sorted(positions.tolist()) == list(range(num_keys))
    owners = slot_map.shard_of(keys)
    for request in requests:
        assert 1 <= len(request.positions) <= max_rows
        assert (owners[request.positions] == request.shard).all()


def test_every_shard_gives_one_unsplit_request_per_shard() -> None:
    keys = np.arange(50, dtype=np.int64)
    slot_map = SlotMap.initial(3)
    present = set(slot_map.shard_of(keys).tolist())
    requests = plan_requests(keys[:1], slot_map, 1, every_shard=True)
    assert sorted(r.shard for r in requests) == [0, 1, 2]
    assert sum(len(r.positions) for r in requests) == 1
    requests = plan_requests(keys, slot_map, 2, every_shard=True)
    assert sorted(r.shard for r in requests) == [0, 1, 2]  # not cut into 2-key batches
    assert present == {0, 1, 2}


def test_plan_rejects_nonpositive_batch() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        plan_requests(np.arange(3), SlotMap.initial(1), 0)


def test_router_runs_requests_in_parallel_and_reassembles(pool) -> None:
    keys = np.random.default_rng(1).integers(0, 10**9, 2000)
    slot_map = SlotMap.initial(4)
    threads: set[int] = set()
    barrier = threading.Barrier(2, timeout=5)  # two shard calls must be in flight together

    def call(shard: int, positions: np.ndarray, epoch: int) -> np.ndarray:
        threads.add(threading.get_ident())
        if shard in (0, 1) and len(positions) and positions[0] == min_positions[shard]:
            barrier.wait()
        assert epoch == 1
        return keys[positions] * 2

    owners = slot_map.shard_of(keys)
    min_positions = {s: int(np.flatnonzero(owners == s)[0]) for s in range(4)}
    router = ShardRouter(slot_map, pool, max_rows=300)
    out = np.empty_like(keys)
    for result in router.run(keys, call):
        out[result.request.positions] = result.value
    np.testing.assert_array_equal(out, keys * 2)
    assert len(threads) >= 2


def _moved_map(epoch: int) -> SlotMap:
    # slots 0..99 move from shard 0 to shard 1
    return SlotMap(
        epoch, (SlotRange(0, 100, 1), SlotRange(100, 8192, 0), SlotRange(8192, 16384, 1))
    )


def _refreshing_to(slot_map: SlotMap) -> tuple[list[int], Callable[[int], SlotMap]]:
    """A slot-map source that always answers ``slot_map``, and the epochs it was asked with."""
    asked: list[int] = []

    def refresh(epoch: int) -> SlotMap:
        asked.append(epoch)
        return slot_map

    return asked, refresh


def test_router_resends_only_refused_keys_after_refresh(pool) -> None:
    old, new = SlotMap.initial(2), _moved_map(2)
    keys = np.arange(5000, dtype=np.int64)
    moved = set(keys[(old.shard_of(keys) == 0) & (new.shard_of(keys) == 1)].tolist())
    assert moved
    served: dict[int, list[int]] = {0: [], 1: []}
    lock = threading.Lock()

    def call(shard: int, positions: np.ndarray, epoch: int) -> None:
        sent = keys[positions]
        if (new.shard_of(sent) != shard).any():  # the node knows the new map
            raise WrongShard("slots moved", epoch=2)
        with lock:
            served[shard].extend(sent.tolist())

    refreshed, refresh = _refreshing_to(new)
    router = ShardRouter(old, pool, max_rows=10_000, refresh=refresh)
    router.run(keys, call)
    assert refreshed == [2]
    assert sorted(served[0] + served[1]) == keys.tolist()  # every key applied exactly once
    assert moved <= set(served[1])
    assert router.slot_map.epoch == 2


def test_router_waits_for_a_new_owner_behind_its_map(pool) -> None:
    """After a move's commit the client may hold the new map before the new owner (say,
    restarted) has it: the owner refuses at the older epoch until activated. Refreshing
    finds the same map, so the keys wait for the owner instead of failing the call."""
    old, new = SlotMap.initial(2), _moved_map(2)
    keys = np.arange(5000, dtype=np.int64)
    served: dict[int, list[int]] = {0: [], 1: []}
    refusals = [0]
    lock = threading.Lock()

    def call(shard: int, positions: np.ndarray, epoch: int) -> None:
        sent = keys[positions]
        with lock:
            if shard == 1 and (old.shard_of(sent) != 1).any() and refusals[0] < 8:
                refusals[0] += 1  # not activated yet: still at epoch 1
                raise WrongShard("not owned", epoch=1)
            served[shard].extend(sent.tolist())

    refreshed, refresh = _refreshing_to(new)
    router = ShardRouter(new, pool, max_rows=10_000, refresh=refresh)
    router.run(keys, call)
    assert refusals[0] == 8 and refreshed == []  # more refusals than reroutes, no refresh
    assert sorted(served[0] + served[1]) == keys.tolist()  # every key applied exactly once


def test_router_waits_for_a_sealed_source_while_its_map_stays(pool) -> None:
    """A source holding a move's slots sealed (or restarted still sealed, until the
    provisioner aborts or finishes the batch) refuses them at the client's own epoch,
    and the map's source has nothing newer: more such refusals than reroutes wait the
    move out, and every key is applied once, by the owner the map names."""
    slot_map = SlotMap.initial(2)
    keys = np.arange(2000, dtype=np.int64)
    served: list[int] = []
    refusals = [0]
    lock = threading.Lock()

    def call(shard: int, positions: np.ndarray, epoch: int) -> None:
        with lock:
            if shard == 0 and refusals[0] < 3 * MAX_REROUTES:
                refusals[0] += 1
                raise WrongShard("the slots of these keys are being moved", epoch=1)
            served.extend(keys[positions].tolist())

    refreshed, refresh = _refreshing_to(slot_map)
    router = ShardRouter(slot_map, pool, max_rows=10_000, refresh=refresh)
    router.run(keys, call)
    assert refusals[0] == 3 * MAX_REROUTES and refreshed == [1] * refusals[0]
    assert sorted(served) == keys.tolist()


def test_router_gives_up_on_slots_held_past_its_patience(pool, monkeypatch) -> None:
    monkeypatch.setattr(routing, "BEHIND_WAIT_S", 0.2)
    slot_map = SlotMap.initial(1)

    def call(shard: int, positions: np.ndarray, epoch: int) -> None:
        raise WrongShard("the slots of these keys are being moved", epoch=1)

    router = ShardRouter(slot_map, pool, max_rows=10, refresh=lambda epoch: slot_map)
    with pytest.raises(RuntimeError, match="held by a move that did not end"):
        router.run(np.arange(3), call)


def test_router_gives_up_when_every_newer_map_is_refused(pool) -> None:
    def call(shard: int, positions: np.ndarray, epoch: int) -> None:
        raise WrongShard("not owned", epoch=epoch)  # always the map the client just got

    def refresh(epoch: int) -> SlotMap:
        return SlotMap(epoch + 1, (SlotRange(0, NUM_SLOTS, 0),))

    router = ShardRouter(SlotMap.initial(1), pool, max_rows=10, refresh=refresh)
    with pytest.raises(RuntimeError, match=f"after {MAX_REROUTES} slot-map refreshes"):
        router.run(np.arange(3), call)
    assert router.slot_map.epoch == 1 + MAX_REROUTES


def test_router_without_refresh_source_raises(pool) -> None:
    def call(shard: int, positions: np.ndarray, epoch: int) -> None:
        raise WrongShard("moved", epoch=5)

    router = ShardRouter(SlotMap.initial(1), pool, max_rows=10)
    with pytest.raises(RuntimeError, match="epoch 1"):
        router.run(np.arange(3), call)


def test_router_reports_first_failure_after_all_calls_finish(pool) -> None:
    finished: list[int] = []

    def call(shard: int, positions: np.ndarray, epoch: int) -> None:
        if shard == 0:
            raise RuntimeError("shard 0 down")
        finished.append(shard)

    router = ShardRouter(SlotMap.initial(3), pool, max_rows=10_000)
    with pytest.raises(RuntimeError, match="shard 0 down"):
        router.run(np.arange(1000), call)
    assert sorted(finished) == [1, 2]


def test_start_sends_every_request_before_any_is_awaited() -> None:
    keys = np.arange(2000, dtype=np.int64)
    sent: list[int] = []
    waited: list[int] = []

    def issue(shard: int, positions: np.ndarray, epoch: int, blocking: bool):
        assert not blocking  # left in flight, as a background update is
        sent.append(shard)

        def wait() -> int:
            assert sorted(sent) == [0, 1, 2]  # everything was out before the first wait
            waited.append(shard)
            return len(positions)

        return wait

    call = ShardRouter(SlotMap.initial(3), max_rows=10_000).start(keys, issue, blocking=False)
    assert sorted(sent) == [0, 1, 2] and waited == []
    results = call.wait()
    assert sum(r.value for r in results) == 2000
    assert call.wait() is results and len(waited) == 3  # a second wait does nothing again


def test_a_failed_call_raises_the_same_error_to_every_waiter() -> None:
    def issue(shard: int, positions: np.ndarray, epoch: int, blocking: bool):
        def wait() -> None:
            raise RuntimeError(f"shard {shard} down")

        return wait

    call = ShardRouter(SlotMap.initial(1), max_rows=10).start(np.arange(3), issue)
    with pytest.raises(RuntimeError, match="shard 0 down") as first:
        call.wait()
    with pytest.raises(RuntimeError) as second:
        call.wait()
    assert second.value is first.value
