"""Routing: the hash is fixed forever, slot maps tile the slot space, keys split by owner."""

import numpy as np
import pytest

from recstore.core.routing import (
    NUM_SLOTS,
    SlotMap,
    SlotRange,
    hash_keys,
    slot_of,
    slots_touched,
    split_by_shard,
)


def _fmix64_reference(key: int) -> int:
    mask = (1 << 64) - 1
    h = key & mask
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & mask
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & mask
    h ^= h >> 33
    return h


@pytest.mark.parametrize("key", [0, 1, 2, 12345, -1, -(2**63), 2**63 - 1, 987654321987])
def test_hash_matches_scalar_reference(key: int) -> None:
    assert int(hash_keys(np.array([key]))[0]) == _fmix64_reference(key)


def test_python_and_the_engine_route_by_one_slot_count() -> None:
    """The count is defined once, in the engine (csrc/hash.h); routing reads it there."""
    from recstore import _native

    assert NUM_SLOTS == _native.NUM_SLOTS == 16384  # fixed forever: every deployed map tiles it
    keys = np.arange(200_000, dtype=np.int64)  # enough keys to reach every slot
    np.testing.assert_array_equal(slots_touched(keys), np.arange(NUM_SLOTS))


def test_slot_values_are_pinned() -> None:
    # Changing the hash would silently move every key of every deployed table.
    assert slot_of(np.arange(4)).tolist() == [_fmix64_reference(k) % NUM_SLOTS for k in range(4)]
    assert int(slot_of(np.array([0]))[0]) == 0  # fmix64(0) == 0


@pytest.mark.parametrize("n", [0, 1, 7, 1024, 100_000])
def test_the_engines_slots_touched_are_the_distinct_slots_of_slot_of(n: int) -> None:
    rng = np.random.default_rng(n)
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    keys[: min(n, 3)] = [-(2**63), 2**63 - 1, 0][: min(n, 3)]
    keys = np.concatenate([keys, keys[: n // 2]])  # repeats
    touched = slots_touched(keys)
    assert touched.dtype == np.uint16
    np.testing.assert_array_equal(touched, np.unique(slot_of(keys)))
    assert slots_touched(list(keys[:5])).tolist() == np.unique(slot_of(keys[:5])).tolist()


@pytest.mark.parametrize(
    ("shards", "expected_sizes"),
    [(1, [16384]), (2, [8192, 8192]), (3, [5462, 5461, 5461]), (16384, [1] * 16384)],
)
def test_initial_map_is_contiguous_and_equal(shards: int, expected_sizes: list[int]) -> None:
    slot_map = SlotMap.initial(shards)
    assert slot_map.epoch == 1
    assert [r.end - r.start for r in slot_map.ranges] == expected_sizes
    assert slot_map.num_shards == shards


@pytest.mark.parametrize("shards", [0, -1, NUM_SLOTS + 1])
def test_initial_map_rejects_bad_shard_counts(shards: int) -> None:
    with pytest.raises(ValueError, match="shards must be"):
        SlotMap.initial(shards)


@pytest.mark.parametrize(
    "ranges",
    [
        (SlotRange(0, 100, 0),),
        (SlotRange(0, 100, 0), SlotRange(101, NUM_SLOTS, 1)),
        (SlotRange(0, 9000, 0), SlotRange(8000, NUM_SLOTS, 1)),
        (SlotRange(0, NUM_SLOTS, -1),),
    ],
)
def test_map_rejects_gaps_and_overlaps(ranges: tuple[SlotRange, ...]) -> None:
    with pytest.raises(ValueError):
        SlotMap(epoch=1, ranges=ranges)


def test_round_trip_and_split_preserve_every_position() -> None:
    slot_map = SlotMap.initial(4)
    assert SlotMap.from_dict(slot_map.to_dict()) == slot_map
    keys = np.random.default_rng(0).integers(-(2**62), 2**62, size=10_000)
    groups = split_by_shard(keys, slot_map)
    positions = np.sort(np.concatenate([g for _, g in groups]))
    assert positions.tolist() == list(range(len(keys)))
    owners = slot_map.shard_of(keys)
    for shard, group in groups:
        assert (owners[group] == shard).all()
    counts = np.bincount(owners, minlength=4)
    assert counts.min() > 0.9 * len(keys) / 4  # the hash spreads keys evenly
