"""Key routing: key -> slot (fixed forever) -> shard (by a versioned slot map).

The SDK, the PS nodes and the operator all route with this module, so a key
lands on the same shard whoever computes it. Routing goes through slots, never
``hash % shards``: resharding then moves only the slots that change owner.

The hash is the 64-bit finaliser of MurmurHash3 (``fmix64``), a bijection on
uint64 with good avalanche; the native engine implements the same function
(``csrc/hash.h``) and a test checks the two agree. ``slots_touched`` (the
distinct slots of a batch, on every named update) runs in the engine, with
``slot_of`` here its oracle.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from recstore.core.errors import InvalidArgument

#: the engine (by name: import-linter cannot see a compiled module)
_native: Any = importlib.import_module("recstore._native")
#: routing slots, fixed forever: the engine's constant (csrc/hash.h), defined once there
NUM_SLOTS: int = int(_native.NUM_SLOTS)
#: trailing metadata of a wrong-owner refusal: the refusing node's slot-map epoch
EPOCH_METADATA_KEY = "x-recstore-epoch"
_SLOT_MASK = np.uint64(NUM_SLOTS - 1)
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


def hash_keys(keys: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """fmix64 of every int64 key (as its two's-complement uint64)."""
    h = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64).copy()
    fmix_in_place(h, np.empty_like(h))
    return h


def fmix_in_place(h: npt.NDArray[np.uint64], scratch: npt.NDArray[np.uint64]) -> None:
    """``h = fmix64(h)`` element-wise, in place (``scratch``: an array of h's shape)."""
    with np.errstate(over="ignore"):
        np.right_shift(h, _S33, out=scratch)
        h ^= scratch
        h *= _C1
        np.right_shift(h, _S33, out=scratch)
        h ^= scratch
        h *= _C2
        np.right_shift(h, _S33, out=scratch)
        h ^= scratch


def slot_of(keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Slot (0 .. NUM_SLOTS - 1) of every key."""
    return (hash_keys(keys) & _SLOT_MASK).astype(np.int64)


def slots_touched(keys: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """The sorted distinct slots of ``keys`` (``np.unique(slot_of(keys))``), by the engine
    in one pass: what a de-dup entry records of the keys of a request."""
    touched: npt.NDArray[np.uint16] = _native.slots_touched(
        np.ascontiguousarray(keys, dtype=np.int64)
    )
    return touched


def slot_mask(mask: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """A selection of slots as a bool array of ``NUM_SLOTS`` entries (True: selected)."""
    selected = np.asarray(mask)
    if selected.shape != (NUM_SLOTS,):
        raise InvalidArgument(
            f"a slot mask has one entry per slot ({NUM_SLOTS}), got shape {selected.shape}"
        )
    return selected.astype(np.bool_, copy=False)


@dataclass(frozen=True)
class SlotRange:
    start: int  # first slot, inclusive
    end: int  # last slot, exclusive
    shard: int


@dataclass(frozen=True)
class SlotMap:
    """Which shard owns each slot, at a given epoch.

    The epoch grows by one with every change of ownership; a node refuses
    keys of slots it does not own and tells the client its epoch, so a client
    with a stale map knows to refresh it.
    """

    epoch: int
    ranges: tuple[SlotRange, ...]

    def __post_init__(self) -> None:
        covered = sorted(self.ranges, key=lambda r: r.start)
        position = 0
        for r in covered:
            if r.start != position or r.end <= r.start or r.shard < 0:
                raise ValueError(f"slot ranges must tile 0..{NUM_SLOTS} without gaps: {r}")
            position = r.end
        if position != NUM_SLOTS:
            raise ValueError(f"slot ranges end at {position}, not {NUM_SLOTS}")

    @classmethod
    def initial(cls, shards: int) -> SlotMap:
        """Contiguous, equal ranges (the first ones one slot longer), epoch 1."""
        if not 1 <= shards <= NUM_SLOTS:
            raise ValueError(f"shards must be in 1..{NUM_SLOTS}, got {shards}")
        base, extra = divmod(NUM_SLOTS, shards)
        ranges, start = [], 0
        for shard in range(shards):
            end = start + base + (1 if shard < extra else 0)
            ranges.append(SlotRange(start, end, shard))
            start = end
        return cls(epoch=1, ranges=tuple(ranges))

    @property
    def num_shards(self) -> int:
        return max(r.shard for r in self.ranges) + 1

    def owner_table(self) -> npt.NDArray[np.int32]:
        """A NUM_SLOTS-long array: owner shard of every slot."""
        table = np.empty(NUM_SLOTS, dtype=np.int32)
        for r in self.ranges:
            table[r.start : r.end] = r.shard
        return table

    def shard_of(self, keys: npt.ArrayLike) -> npt.NDArray[np.int32]:
        """Owner shard of every key."""
        return self.owner_table()[slot_of(keys)]

    def slots_of_shard(self, shard: int) -> list[tuple[int, int]]:
        return [(r.start, r.end) for r in self.ranges if r.shard == shard]

    def to_dict(self) -> dict[str, object]:
        return {"epoch": self.epoch, "ranges": [[r.start, r.end, r.shard] for r in self.ranges]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlotMap:
        raw = data["ranges"]
        if not isinstance(raw, Iterable):
            raise ValueError("slot map ranges must be a list of [start, end, shard]")
        ranges = tuple(SlotRange(int(r[0]), int(r[1]), int(r[2])) for r in raw)
        return cls(epoch=int(data["epoch"]), ranges=ranges)


def split_by_shard(
    keys: npt.NDArray[np.int64], slot_map: SlotMap
) -> list[tuple[int, npt.NDArray[np.intp]]]:
    """Positions of ``keys`` grouped by owner shard: [(shard, positions), ...]."""
    owners = slot_map.shard_of(keys)
    order = np.argsort(owners, kind="stable")
    sorted_owners = owners[order]
    bounds = np.flatnonzero(np.diff(sorted_owners)) + 1
    groups: Sequence[npt.NDArray[np.intp]] = np.split(order, bounds)
    return [(int(owners[g[0]]), g) for g in groups if len(g)]
