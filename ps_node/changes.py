"""Which rows of a set of slots changed since a point: the change tracker.

A slot migration snapshots its slots while the source keeps serving, then
streams the rows changed meanwhile; an incremental checkpoint needs the same
list (rows changed since the previous checkpoint). The tracker records keys,
not rows: whoever drains it reads each row as it is then (value and optimizer
state), and a drained key that is no longer resident was evicted or erased,
which the reader passes on as a deletion. Every mutation path records: updates,
pushes, imports, rows a pull inserted (any pulled key may be new, so pulls
record every key they touch) and evictions (``record`` with the evicted keys).
"""

from __future__ import annotations

import threading

import numpy as np

from recstore.core import slot_of


class ChangeTracker:
    """Thread-safe set of changed keys, limited to the slots in ``slots`` (bool per slot)."""

    def __init__(self, slots: np.ndarray) -> None:
        self.slots = slots
        self._lock = threading.Lock()
        self._pending: list[np.ndarray] = []
        self._recorded = 0

    def touches(self, keys: np.ndarray) -> bool:
        """Whether any of ``keys`` lies in a tracked slot."""
        return bool(len(keys)) and bool(self.slots[slot_of(keys)].any())

    def record(self, keys: np.ndarray) -> None:
        """Note ``keys`` as changed (keys outside the tracked slots are ignored)."""
        if not len(keys):
            return
        mine = keys[self.slots[slot_of(keys)]]
        if len(mine):
            with self._lock:
                self._pending.append(np.array(mine, dtype=np.int64, copy=True))
                self._recorded += len(mine)

    @property
    def pending(self) -> int:
        """Keys recorded since the last drain (with repeats): the lag a catch-up reads."""
        with self._lock:
            return self._recorded

    def drain(self) -> np.ndarray:
        """The distinct keys changed since the previous drain (sorted), and start afresh."""
        with self._lock:
            pending, self._pending, self._recorded = self._pending, [], 0
        if not pending:
            return np.empty(0, dtype=np.int64)
        return np.unique(np.concatenate(pending))
