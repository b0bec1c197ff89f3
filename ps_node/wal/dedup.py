"""The de-dup window of one table: a resent update is answered, not applied again.

A client that lost the reply of an update resends it with the same request id
(``recstore.core.request_id``). The window remembers, per table, the last
``capacity`` ids applied, each with a digest of its content, its
acknowledgement (rows per update item) and the slots its keys touched:

- ``begin`` of an id not seen: the caller applies the request, then ``finish``
  records it (or ``abandon`` when it was refused before anything was applied);
- ``begin`` of an id being applied right now waits for that outcome;
- ``begin`` of an id applied already returns its entry: the caller answers with
  the recorded acknowledgement; the same id with another digest is refused
  (``RequestIdReused``, nothing applied);
- the bound: past ``capacity`` entries the oldest is evicted, and the client's
  low-water mark rises to its seq. A resend at or below the mark that is no
  longer in the window is refused (``RequestOutcomeUnknown``), never applied a
  second time. Marks are kept for the last ``capacity`` clients that lost an
  entry; a client forgotten beyond that loses this protection for ids evicted
  before, which needs more than ``capacity`` other clients' evictions between
  a send and its resend.

Online resharding moves the entries with their slots: ``changes_touching``
lists those of the slots that move added or changed since a version of the
window (so the catch-up rounds carry most of them and the seal's tail only
the rest), ``absorb`` takes them on the target. The
write-ahead log keeps the window across a restart (``recstore.ps.wal.dedup_log``).
Pure logic, thread-safe.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from recstore.core import InvalidArgument
from recstore.core.errors import RequestOutcomeUnknown
from recstore.core.request_id import RequestId

WINDOW_ENV = "RECSTORE_DEDUP_WINDOW"
DEFAULT_CAPACITY = 4096  # ids per table: minutes of a trainer's steps, a few MB at most


class RequestIdReused(InvalidArgument):
    """A request id already applied with other content: refused, nothing applied."""


@dataclass(frozen=True, slots=True)  # thousands are held per table: no __dict__ each
class Entry:
    """One applied request, as one table's window records it."""

    request_id: RequestId
    digest: bytes
    rows: tuple[int, ...]  # the acknowledgement: rows per update item of the request
    slots: np.ndarray  # sorted distinct uint16 slots this table's keys of it touched
    log_seq: int = 0  # its log record to await before answering (0: durable already)

    def merged(self, other: Entry) -> Entry:
        """The same request logged in several records of one table: their slots together."""
        slots = np.union1d(self.slots, other.slots).astype(np.uint16)
        return replace(self, slots=slots, log_seq=max(self.log_seq, other.log_seq))


def capacity_from_env() -> int:
    raw = os.environ.get(WINDOW_ENV, "")
    if not raw:
        return DEFAULT_CAPACITY
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{WINDOW_ENV} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{WINDOW_ENV} must be a positive integer, got {value}")
    return value


class DedupWindow:
    """The bounded window of one table (see the module docstring)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"a de-dup window holds at least 1 entry, got {capacity}")
        self.capacity = capacity
        self._cond = threading.Condition()
        self._done: OrderedDict[RequestId, Entry] = OrderedDict()  # oldest first
        self._applying: set[RequestId] = set()
        self._low_water: OrderedDict[str, int] = OrderedDict()  # client -> highest evicted seq
        self._version = 0  # one more at every entry added or merged
        self._changed: OrderedDict[RequestId, int] = OrderedDict()  # id -> version, oldest first
        #: how many ``begin`` calls are waiting for an id being applied (tests watch it)
        self.waiting = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._done)

    def begin(self, request_id: RequestId, digest: bytes) -> Entry | None:
        """None: the caller applies ``request_id`` now; an entry: it was applied already."""
        with self._cond:
            while request_id in self._applying:
                self.waiting += 1
                self._cond.notify_all()
                try:
                    self._cond.wait()
                finally:
                    self.waiting -= 1
            entry = self._done.get(request_id)
            if entry is not None:
                if entry.digest != digest:
                    raise RequestIdReused(
                        f"request id ({request_id.client!r}, {request_id.seq}) was applied "
                        "already with other content: refused, nothing applied"
                    )
                return entry
            if request_id.seq <= self._low_water.get(request_id.client, 0):
                raise RequestOutcomeUnknown(
                    f"request id ({request_id.client!r}, {request_id.seq}) is older than this "
                    f"node's de-dup window ({self.capacity} ids per table): it may have been "
                    "applied; refused, nothing applied"
                )
            self._applying.add(request_id)
            return None

    def finish(self, entry: Entry) -> None:
        """Record the request ``begin`` let the caller apply."""
        with self._cond:
            self._applying.discard(entry.request_id)
            self._add(entry)
            self._cond.notify_all()

    def abandon(self, request_id: RequestId) -> None:
        """The request was refused before anything was applied: a resend may apply it."""
        with self._cond:
            self._applying.discard(request_id)
            self._cond.notify_all()

    def wait_for_waiters(self, count: int, timeout: float) -> bool:
        """Block until ``count`` ``begin`` calls wait for an id being applied (tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.waiting >= count, timeout)

    # -- restart and resharding -------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every recorded entry, oldest first."""
        with self._cond:
            return list(self._done.values())

    def entries_touching(self, slot_mask: np.ndarray) -> list[Entry]:
        """Entries whose keys touched any slot where ``slot_mask`` (bool per slot) is set."""
        return [entry for _, entry in self.changes_touching(slot_mask, 0)[0]]

    def changes_touching(
        self, slot_mask: np.ndarray, since: int
    ) -> tuple[list[tuple[int, Entry]], int]:
        """(version, entry) of the entries added or changed after version ``since`` whose
        keys touched a slot of ``slot_mask``, oldest change first, and the version now (the
        next call's ``since``, or the version of the last entry a caller took of them).
        Reads only the entries changed since, newest first."""
        mask = np.asarray(slot_mask, dtype=bool)
        with self._cond:
            found = []
            for request_id, version in reversed(self._changed.items()):
                if version <= since:
                    break
                entry = self._done[request_id]
                if len(entry.slots) and mask[entry.slots].any():
                    found.append((version, entry))
            found.reverse()
            return found, self._version

    def absorb(self, entries: Iterable[Entry]) -> None:
        """Take entries of another window (a slot move) or of the log (a restart).

        An id held already gets the slots of both; an absorbed entry counts as
        durable here (its ``log_seq`` belonged to another log).
        """
        with self._cond:
            for entry in entries:
                self._add(replace(entry, log_seq=0))
            self._cond.notify_all()

    def _add(self, entry: Entry) -> None:
        self._version += 1
        self._changed[entry.request_id] = self._version
        self._changed.move_to_end(entry.request_id)
        held = self._done.get(entry.request_id)
        if held is not None:
            self._done[entry.request_id] = held.merged(entry)
            return
        self._done[entry.request_id] = entry
        while len(self._done) > self.capacity:
            evicted, _ = self._done.popitem(last=False)
            del self._changed[evicted]
            mark = max(self._low_water.pop(evicted.client, 0), evicted.seq)
            self._low_water[evicted.client] = mark  # most recent last
            while len(self._low_water) > self.capacity:
                self._low_water.popitem(last=False)


def begin_all(
    windows: Sequence[DedupWindow], request_id: RequestId, digest: bytes
) -> list[Entry] | None:
    """``begin`` in every window of a multi-table request (in the order given, the
    same for every caller): None when the caller applies it now, else the entries.

    Known to some windows only (an eviction or a move split it) is refused with
    ``RequestOutcomeUnknown``; the windows that began it are abandoned.
    """
    entries: list[Entry | None] = []
    try:
        for window in windows:
            entries.append(window.begin(request_id, digest))
    except BaseException:
        abandon_all([w for w, e in zip(windows, entries, strict=False) if e is None], request_id)
        raise
    known = [e for e in entries if e is not None]
    if not known:
        return None
    if len(known) == len(entries):
        return known
    abandon_all([w for w, e in zip(windows, entries, strict=True) if e is None], request_id)
    raise RequestOutcomeUnknown(
        f"request id ({request_id.client!r}, {request_id.seq}) is known to {len(known)} of "
        f"the {len(entries)} tables it updates (evicted or moved): it may have been applied; "
        "refused, nothing applied"
    )


def abandon_all(windows: Iterable[DedupWindow], request_id: RequestId) -> None:
    for window in windows:
        window.abandon(request_id)
