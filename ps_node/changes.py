"""Which rows of a set of slots changed since a point: the change tracker.

A reshard snapshots its slots while the source keeps serving, then
streams the rows changed meanwhile; an incremental checkpoint needs the same
list (rows changed since the previous checkpoint). The tracker records keys,
not rows: whoever drains it reads each row as it is then (value and optimizer
state), and a drained key that is no longer resident was evicted or erased,
which the reader passes on as a deletion. Every mutation path records: updates,
pushes, imports, rows a pull inserted (any pulled key may be new, so pulls
record every key they touch) and evictions (``record`` with the evicted keys).
Repeats are merged once many keys are held, so memory stays near the number
of distinct keys however long the next drain is in coming.
"""

from __future__ import annotations

import threading

import numpy as np

from recstore.core import NUM_SLOTS, slot_of

#: keys held (with repeats) before they are merged: bounds memory when drains are rare
MERGE_AT = 1 << 22


def distinct(keys: np.ndarray) -> np.ndarray:
    """The sorted distinct keys (by sorting: numpy's hashing ``unique`` is far slower on int64)."""
    ordered = np.sort(keys)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


class ChangeTracker:
    """Thread-safe set of changed keys, limited to the slots in ``slots`` (bool per slot)."""

    def __init__(self, slots: np.ndarray) -> None:
        self.slots = slots
        self.everywhere = bool(slots.all())  # every slot: no key needs hashing
        self._lock = threading.Lock()
        self._pending: list[np.ndarray] = []
        self._recorded = 0
        self._held = 0  # keys in _pending, repeats included
        self._merge_at = MERGE_AT

    def touches(self, keys: np.ndarray) -> bool:
        """Whether any of ``keys`` lies in a tracked slot."""
        return bool(len(keys)) and bool(self.slots[slot_of(keys)].any())

    def record(self, keys: np.ndarray) -> None:
        """Note ``keys`` as changed (keys outside the tracked slots are ignored)."""
        if not len(keys):
            return
        mine = keys if self.everywhere else keys[self.slots[slot_of(keys)]]
        if len(mine):
            with self._lock:
                self._pending.append(np.array(mine, dtype=np.int64, copy=True))
                self._recorded += len(mine)
                self._held += len(mine)
                if self._held > self._merge_at:
                    merged = distinct(np.concatenate(self._pending))
                    self._pending, self._held = [merged], len(merged)
                    self._merge_at = max(MERGE_AT, 2 * len(merged))

    @classmethod
    def of_every_slot(cls) -> ChangeTracker:
        """A tracker of the whole table (what an incremental checkpoint needs)."""
        return cls(np.ones(NUM_SLOTS, dtype=bool))

    @property
    def pending(self) -> int:
        """Keys recorded since the last drain (with repeats): the lag a catch-up reads."""
        with self._lock:
            return self._recorded

    def drain(self) -> np.ndarray:
        """The distinct keys changed since the previous drain (sorted), and start afresh."""
        with self._lock:
            pending, self._pending, self._recorded = self._pending, [], 0
            self._held, self._merge_at = 0, MERGE_AT
        if not pending:
            return np.empty(0, dtype=np.int64)
        return distinct(np.concatenate(pending))
