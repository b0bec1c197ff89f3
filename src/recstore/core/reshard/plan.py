"""Online resharding, the pure part: which slots move, in which batches, and the job record.

Both provisioners (the operator and the local one) run the same protocol, so
what they decide lives here: no I/O, no clock. A move from N to M shards ends
with the contiguous equal ranges of ``SlotMap.initial(M)``, but each range
keeps the shard that already holds most of it, so only about
|M-N|/max(M,N) of the slots change owner. Growing starts the new shards
first; shrinking empties the highest shards before they are removed.

A provisioner stores the ``ReshardJob`` durably after every phase change;
a restarted one reads it back and asks ``resume_action``: a batch whose
commit (the epoch CAS e -> e+1) happened is finished, any other is aborted
(the source is still authoritative) and copied again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import numpy as np

from recstore.core.routing import NUM_SLOTS, SlotMap, SlotRange

#: slots per batch unless a provisioner asks otherwise (one seal pauses this many)
DEFAULT_BATCH_SLOTS = 1024
#: resident keys a batch should hold at most: its tail lists every one of them (8 bytes a
#: key) and the source's checksum pass reads all their rows, both inside the write pause
BATCH_KEYS = 1 << 18


class Phase(str, Enum):
    """Where the current batch of a job stands (stored after every change)."""

    copying = "copying"  # target importing, source tracking changes and streaming
    sealed = "sealed"  # source holds writes to the batch; tail sent, checksums compared
    committed = "committed"  # epoch bumped in the one place that holds the map
    done = "done"  # every batch committed and cleaned up


def ranges_mask(ranges: Iterable[tuple[int, int]]) -> np.ndarray:
    """A NUM_SLOTS-long bool array from [start, end) ranges (ValueError when out of range)."""
    mask = np.zeros(NUM_SLOTS, dtype=np.bool_)
    for start, end in ranges:
        if not 0 <= start < end <= NUM_SLOTS:
            raise ValueError(f"slot range [{start}, {end}) is not within 0..{NUM_SLOTS}")
        mask[start:end] = True
    return mask


@dataclass(frozen=True)
class SlotBatch:
    """Slots that move together from one shard to another (ranges: [start, end))."""

    source: int
    target: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def slots(self) -> int:
        return sum(end - start for start, end in self.ranges)

    def mask(self) -> np.ndarray:
        """A NUM_SLOTS-long bool array: True for the batch's slots."""
        return ranges_mask(self.ranges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "ranges": [list(r) for r in self.ranges],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlotBatch:
        ranges = tuple((int(r[0]), int(r[1])) for r in data["ranges"])
        return cls(int(data["source"]), int(data["target"]), ranges)


def target_map(current: SlotMap, shards: int) -> SlotMap:
    """The map after a move to ``shards``: initial(shards)'s ranges, each on the surviving
    shard that owns most of it now (greedy by overlap), new shards taking the rest.

    The epoch is the current one; each committed batch bumps it.
    """
    goal = SlotMap.initial(shards).ranges
    owners = current.owner_table()
    overlap = np.zeros((len(goal), shards), dtype=np.int64)
    for i, r in enumerate(goal):
        counts = np.bincount(owners[r.start : r.end], minlength=max(shards, current.num_shards))
        overlap[i] = counts[:shards]
    assigned: dict[int, int] = {}
    free = set(range(shards))
    for flat in np.argsort(-overlap, axis=None, kind="stable"):
        i, shard = divmod(int(flat), shards)
        if i not in assigned and shard in free:
            assigned[i] = shard
            free.discard(shard)
    ranges = tuple(SlotRange(r.start, r.end, assigned[i]) for i, r in enumerate(goal))
    return SlotMap(epoch=current.epoch, ranges=ranges)


def sized_batch_slots(rows_per_slot: float, batch_slots: int = DEFAULT_BATCH_SLOTS) -> int:
    """``batch_slots``, or fewer, so that a batch of slots holding ``rows_per_slot`` rows
    each holds about ``BATCH_KEYS`` rows at most (at least one slot; 0 rows: unknown)."""
    if rows_per_slot <= 0:
        return batch_slots
    return max(1, min(batch_slots, int(BATCH_KEYS // rows_per_slot)))


def plan_batches(
    current: SlotMap, shards: int, batch_slots: int = DEFAULT_BATCH_SLOTS
) -> list[SlotBatch]:
    """The batches that take ``current`` to ``target_map(current, shards)``.

    Each batch is at most ``batch_slots`` slots of one (source, target) pair;
    batches leaving the highest shards come first, so a shrink empties them early.
    """
    if batch_slots < 1:
        raise ValueError(f"batch_slots must be >= 1, got {batch_slots}")
    before = current.owner_table()
    after = target_map(current, shards).owner_table()
    batches: list[SlotBatch] = []
    pairs = sorted({(int(s), int(t)) for s, t in zip(before, after, strict=True) if s != t})
    for source, target in sorted(pairs, key=lambda p: (-p[0], p[1])):
        slots = np.flatnonzero((before == source) & (after == target))
        for start in range(0, len(slots), batch_slots):
            batches.append(SlotBatch(source, target, _runs(slots[start : start + batch_slots])))
    return batches


def _runs(slots: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Sorted slot numbers as [start, end) runs."""
    breaks = np.flatnonzero(np.diff(slots) != 1) + 1
    return tuple((int(run[0]), int(run[-1]) + 1) for run in np.split(slots, breaks))


def moved(slot_map: SlotMap, batch: SlotBatch) -> SlotMap:
    """``slot_map`` with the batch's slots on its target, one epoch later (the commit)."""
    owners = slot_map.owner_table()
    owners[batch.mask()] = batch.target
    edges = np.flatnonzero(np.diff(owners)) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [NUM_SLOTS]))
    ranges = tuple(
        SlotRange(int(s), int(e), int(owners[s])) for s, e in zip(starts, ends, strict=True)
    )
    return SlotMap(epoch=slot_map.epoch + 1, ranges=ranges)


@dataclass(frozen=True)
class ReshardJob:
    """One table's move from ``from_shards`` to ``to_shards``, as a provisioner stores it.

    ``current`` indexes ``batches``; ``base_epoch`` is the map's epoch when the current
    batch started (its commit makes it base_epoch + 1).
    """

    table: str
    from_shards: int
    to_shards: int
    batches: tuple[SlotBatch, ...]
    current: int = 0
    phase: Phase = Phase.copying
    base_epoch: int = 1
    bytes_moved: int = 0
    error: str = ""
    slots_total: int = field(default=0)

    @classmethod
    def start(
        cls, table: str, slot_map: SlotMap, shards: int, batch_slots: int = DEFAULT_BATCH_SLOTS
    ) -> ReshardJob:
        batches = tuple(plan_batches(slot_map, shards, batch_slots))
        return cls(
            table, slot_map.num_shards, shards, batches, base_epoch=slot_map.epoch,
            phase=Phase.copying if batches else Phase.done,
            slots_total=sum(b.slots for b in batches),
        )  # fmt: skip

    @property
    def batch(self) -> SlotBatch:
        return self.batches[self.current]

    @property
    def slots_moved(self) -> int:
        done = self.batches[: self.current] if self.phase != Phase.done else self.batches
        return sum(b.slots for b in done)

    def at(self, phase: Phase, **changes: Any) -> ReshardJob:
        return replace(self, phase=phase, **changes)

    def next_batch(self, epoch: int, batch_bytes: int) -> ReshardJob:
        """The current batch committed and cleaned up: on to the next one (or done)."""
        following = self.current + 1
        phase = Phase.done if following >= len(self.batches) else Phase.copying
        return replace(
            self, current=min(following, len(self.batches) - 1) if self.batches else 0,
            phase=phase, base_epoch=epoch, bytes_moved=self.bytes_moved + batch_bytes,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table, "from_shards": self.from_shards, "to_shards": self.to_shards,
            "batches": [b.to_dict() for b in self.batches], "current": self.current,
            "phase": self.phase.value, "base_epoch": self.base_epoch,
            "bytes_moved": self.bytes_moved, "error": self.error, "slots_total": self.slots_total,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReshardJob:
        return cls(
            str(data["table"]), int(data["from_shards"]), int(data["to_shards"]),
            tuple(SlotBatch.from_dict(b) for b in data["batches"]), int(data["current"]),
            Phase(data["phase"]), int(data["base_epoch"]), int(data.get("bytes_moved", 0)),
            str(data.get("error", "")), int(data.get("slots_total", 0)),
        )  # fmt: skip


class ResumeAction(str, Enum):
    finish = "finish"  # the commit happened: activate the target, unseal and clean the source
    abort = "abort"  # no commit: unseal the source (still authoritative), drop the import
    none = "none"  # nothing in flight


def resume_action(job: ReshardJob, epoch: int) -> ResumeAction:
    """What a restarted provisioner does with the current batch, given the stored map's epoch."""
    if job.phase == Phase.done:
        return ResumeAction.none
    if epoch == job.base_epoch + 1:
        return ResumeAction.finish
    if epoch != job.base_epoch:
        raise ValueError(
            f"table {job.table!r}: stored slot map is at epoch {epoch}, but the job's batch "
            f"started at {job.base_epoch}; the job record and the map disagree"
        )
    return ResumeAction.abort
