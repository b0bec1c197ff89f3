"""A node's side of online resharding: outgoing (source) and importing (target) slots.

The protocol is driven from outside (``recstore.core.reshard.plan`` plans it, a
provisioner runs it); this module keeps what one node must hold while it runs:

- source: the slots being moved out, a ``ChangeTracker`` recording every
  mutation of them, and the seal. While sealed, requests touching those slots
  wait (held, not refused) until the move commits or aborts; a sealing call
  first waits for the requests already inside to finish (drain), within a
  deadline, so the tail it then reads is complete. A held request that waits
  longer than ``HOLD_LIMIT_S`` is refused with the wrong-owner error, nothing
  applied, so a caller can always resend it. The source never unseals itself:
  only an abort, or the new slot map (then held requests are refused as not
  owned), ends a seal, because the commit happens elsewhere.
- target: slots marked importing. They are not in the node's slot map yet,
  so client requests for them are refused as not owned; imported rows are
  written straight into the engine.

The de-duplication window of exactly-once updates travels with the slots:
its entries touching the sealed slots go in the tail (``reshard_steps.seal``)
and the target absorbs them, so a resend reaching the new owner is answered
from the window instead of being applied twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from recstore.core import NUM_SLOTS, InvalidArgument, WrongShard, hash_keys, slot_of
from recstore.core.errors import ReshardConflict, SealTimeout
from recstore.core.reshard.plan import ranges_mask
from recstore.core.routing import fmix_in_place
from recstore.ps.changes import ChangeTracker
from recstore.store import Table
from recstore.store.table import Chunk

if TYPE_CHECKING:
    from recstore.ps.reshard.import_sums import RunningSums

#: the longest a request waits on a sealed slot before it is refused (nothing applied)
HOLD_LIMIT_S = 5.0


@dataclass
class Outgoing:
    slots: np.ndarray  # bool per slot
    target: int
    tracker: ChangeTracker
    sealed: bool = False
    sealed_at: float = 0.0  # time.monotonic() of the seal: the write pause starts there
    inside: int = 0  # admitted requests touching the slots, not yet finished
    snapshot: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # sorted keys
    #: the de-dup window's version whose entries of the slots went out already (0: none)
    window_sent: int = 0


def resharding_slots(ranges: list[tuple[int, int]]) -> np.ndarray:
    """The slots of a reshard step's [start, end) ranges (at least one, all in range)."""
    try:
        mask = ranges_mask(ranges)
    except ValueError as error:
        raise InvalidArgument(str(error)) from None
    if not mask.any():
        raise InvalidArgument("a reshard needs at least one slot")
    return mask


class Reshards:
    """The reshards of one node's tables; thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.outgoing: dict[str, Outgoing] = {}
        self.importing: dict[str, np.ndarray] = {}
        #: the importing slots' checksums, kept as rows arrive (recstore.ps.reshard.import_sums)
        self.import_sums: dict[str, RunningSums] = {}

    # -- the data path ------------------------------------------------------------
    @contextlib.contextmanager
    def admitted(self, name: str, keys: np.ndarray | None, epoch: int) -> Iterator[None]:
        """Run a request on ``name`` (``keys``; None: a multi-table request, any slot).

        Waits while it touches sealed slots; counted as inside while it runs, so a
        seal can drain it. Requests not touching moving slots pass straight through.
        """
        out = self.outgoing.get(name)
        if out is None or (keys is not None and not out.tracker.touches(keys)):
            yield
            return
        deadline = time.monotonic() + HOLD_LIMIT_S
        with self._cond:
            while out.sealed and self.outgoing.get(name) is out:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WrongShard(
                        f"table {name!r}: the slots of these keys are being moved; "
                        f"nothing was applied, resend (slot-map epoch {epoch})",
                        epoch,
                    )
                self._cond.wait(left)
            if self.outgoing.get(name) is not out:  # committed or aborted meanwhile
                yield
                return
            out.inside += 1
        try:
            yield
        finally:
            with self._cond:
                out.inside -= 1
                self._cond.notify_all()

    def record(self, name: str, keys: np.ndarray) -> None:
        """Note a mutation of ``keys`` (applied under ``admitted``)."""
        out = self.outgoing.get(name)
        if out is not None:
            out.tracker.record(keys)

    def tracks(self, name: str) -> bool:
        return name in self.outgoing

    # -- source -------------------------------------------------------------------
    def begin(self, name: str, slots: np.ndarray, target: int, owned: np.ndarray | None) -> None:
        """Start tracking changes of ``slots`` (all owned by this node) for ``target``."""
        if owned is not None and not owned[slots].all():
            raise ReshardConflict(f"table {name!r}: this node does not own every slot to move")
        with self._cond:
            current = self.outgoing.get(name)
            if current is not None:
                if np.array_equal(current.slots, slots) and current.target == target:
                    # a resent begin: the same move, keep its changes; the target may have
                    # lost the de-dup entries sent (restarted without a log): all again
                    current.window_sent = 0
                    return
                raise ReshardConflict(f"table {name!r} is already moving slots out")
            self.outgoing[name] = Outgoing(slots, target, ChangeTracker(slots))

    def changes(self, name: str) -> np.ndarray:
        """Keys of the moving slots changed since the previous call (the catch-up)."""
        return self.outgoing_of(name).tracker.drain()

    def seal(self, name: str, timeout: float) -> np.ndarray:
        """Hold new requests to the moving slots, drain those inside, return the last changes."""
        with self._cond:
            out = self.outgoing_of(name)
            out.sealed, out.sealed_at = True, time.monotonic()
            if not self._cond.wait_for(lambda: out.inside == 0, timeout):
                out.sealed = False
                self._cond.notify_all()
                raise SealTimeout(
                    f"table {name!r}: {out.inside} requests still running after {timeout:.3f}s; "
                    "unsealed, the move can be retried"
                )
        return out.tracker.drain()

    def end(self, name: str) -> Outgoing | None:
        """Stop the outgoing move (commit or abort); held requests go on and re-check."""
        with self._cond:
            out = self.outgoing.pop(name, None)
            self._cond.notify_all()
            return out

    def outgoing_of(self, name: str) -> Outgoing:
        out = self.outgoing.get(name)
        if out is None:
            raise ReshardConflict(f"table {name!r} is not moving slots out")
        return out

    # -- target -------------------------------------------------------------------
    def check_import(self, name: str, slots: np.ndarray, owned: np.ndarray | None) -> None:
        """ReshardConflict when ``slots`` cannot be imported now (nothing changes)."""
        if owned is None or owned[slots].any():
            raise ReshardConflict(f"table {name!r}: this node already owns slots to import")
        current = self.importing.get(name)
        if current is not None and not np.array_equal(current, slots):
            raise ReshardConflict(f"table {name!r} is already importing other slots")

    def begin_import(self, name: str, slots: np.ndarray, owned: np.ndarray | None) -> None:
        with self._cond:
            self.check_import(name, slots, owned)
            self.importing[name] = slots
            self.import_sums.pop(name, None)

    def importing_slots(self, name: str) -> np.ndarray:
        slots = self.importing.get(name)
        if slots is None:
            raise ReshardConflict(f"table {name!r} is not importing slots")
        return slots

    def end_import(self, name: str) -> np.ndarray | None:
        with self._cond:
            self.import_sums.pop(name, None)
            return self.importing.pop(name, None)


# -- rows of slots ----------------------------------------------------------------
def mask_ranges(slots: np.ndarray) -> list[tuple[int, int]]:
    """A bool-per-slot array as sorted [start, end) runs."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], slots, [False])).astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def keys_in(table: Table, slots: np.ndarray) -> np.ndarray:
    """Resident keys of ``table`` whose slot is in ``slots``."""
    return table.keys_in_slots(slots)


def keys_not_in(resident: np.ndarray, present: np.ndarray) -> np.ndarray:
    """The ``resident`` keys (distinct) missing from ``present`` (a seal's tail).

    Almost always there are none: the sets are then the same size with the same
    sum of key hashes (order-free, like the slot checksums), checked in two
    passes; only sets that differ pay for the sort of a set difference.
    """
    if len(resident) == len(present):
        with np.errstate(over="ignore"):
            if hash_keys(resident).sum(dtype=np.uint64) == hash_keys(present).sum(dtype=np.uint64):
                return resident[:0]
    # repeats in present could not mislead this either
    return np.setdiff1d(resident, present, assume_unique=True)


def rows_of(table: Table, keys: np.ndarray) -> tuple[Chunk, np.ndarray]:
    """The rows of ``keys`` still resident, and the keys that are gone (evicted or erased)."""
    chunk = table.export_keys(keys)
    # keys are distinct (drained from a tracker): the set difference needs no sort of its own
    gone = np.setdiff1d(keys, chunk.keys, assume_unique=True)
    return chunk, gone


def slot_checksums(table: Table, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-slot (slot numbers, row counts, order-independent sums of row hashes).

    A row's hash covers its key, value bytes and optimizer state bytes, so two
    copies agree only when every row and its state are equal. The CPU engine
    computes them in one pass over its rows (run twice per batch while its
    slots are sealed); other engines hash their exported rows.
    """
    native = table.native_slot_checksums(slots)
    if native is None:
        return exported_slot_checksums(table, slots)
    wanted = np.flatnonzero(slots)
    counts, sums = native
    return wanted, counts[wanted], sums[wanted]


def exported_slot_checksums(
    table: Table, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``slot_checksums`` from exported rows and ``row_hashes``: the definition in numpy."""
    chunk = table.export_keys(keys_in(table, slots))
    h = row_hashes(chunk)
    row_slots = slot_of(chunk.keys)
    order = np.argsort(row_slots, kind="stable")
    ordered = row_slots[order]
    wanted = np.flatnonzero(slots)
    counts = np.bincount(ordered, minlength=NUM_SLOTS)[wanted].astype(np.int64)
    sums = np.zeros(NUM_SLOTS, dtype=np.uint64)
    if len(ordered):
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        sums[ordered[starts]] = np.add.reduceat(h[order], starts)  # wraps mod 2**64
    return wanted, counts, sums[wanted]


def row_hashes(chunk: Chunk) -> np.ndarray:
    """fmix64 chained over each row: its key, then every 8-byte word of its value bytes
    followed by its state bytes (zero-padded to a whole word).

    Computed a word column at a time in place. The CPU engine's one-pass twin
    (``csrc/table_slots.cc``) must equal this; the tests hold it to it.
    """
    n = len(chunk.keys)
    values = chunk.values.view(np.uint8).reshape(n, chunk.values.itemsize * chunk.values.shape[1])
    state = chunk.state.view(np.uint8).reshape(n, chunk.state.itemsize * chunk.state.shape[1])
    # a value row ending mid-word runs into the state: then hash them joined
    split = values.shape[1] % 8 == 0
    parts = [values, state] if split else [np.concatenate([values, state], axis=1)]
    h = hash_keys(chunk.keys)
    scratch = np.empty_like(h)
    for part in parts:
        whole = part.shape[1] // 8
        columns = [np.ascontiguousarray(part[:, : 8 * whole]).view(np.uint64)]
        if part.shape[1] % 8:
            last = np.zeros((n, 8), np.uint8)
            last[:, : part.shape[1] % 8] = part[:, 8 * whole :]
            columns.append(last.view(np.uint64))
        for words in columns:
            for column in range(words.shape[1]):
                h ^= words[:, column]
                fmix_in_place(h, scratch)
    return h
