"""A target's checksums of its importing slots, kept up to date as rows arrive.

A batch is verified while its slots are sealed: the source's checksums against
the target's. A full pass over the target's rows there would hash the whole
batch again inside the write pause, so the target keeps per-slot sums as it
imports instead: one pass when the import begins (its importing slots are then
empty, or hold what an earlier try left), then, for every import, the hashes
of the rows it is about to replace or erase taken out and those of the rows as
written put in, each read from the engine where the rows lie. The tail's
checksums then cost the tail's rows.

This holds while only imports change the importing slots: clients are refused
there (the node does not own them yet) and imports hold the table's lock. The
engine's other removals (evictions, expiries, erasures) are counted
(``removal_counts``); a count that moved other than by an import's own
erasures drops the running sums, and the checksums come from a full pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recstore.core import slot_of
from recstore.core.reshard.messages import Checksums
from recstore.store import Table


def removal_counts(table: Table) -> tuple[int, ...] | None:
    """The engine's counts of rows it removed (evicted, expired, erased).

    Slots a node does not own are refused to clients and written only by imports, so
    while no import runs only a removal can change their rows: equal counts mean
    their checksums are unchanged. None when counts cannot vouch for that: rows that
    expire by time alone (a TTL) drop out of checksums uncounted, and an engine that
    keeps no counts.
    """
    if table.spec.keys.ttl_seconds is not None:
        return None
    stats = table.stats()
    counts = [stats.get(k) for k in ("evictions", "expirations", "erasures")]
    return None if None in counts else tuple(int(c) for c in counts)  # type: ignore[arg-type]


@dataclass
class RunningSums:
    """Per-slot row counts and wrapping sums of row hashes of one table's importing slots."""

    table: Table
    slots: np.ndarray  # bool per slot
    counts: np.ndarray  # int64[NUM_SLOTS]
    sums: np.ndarray  # uint64[NUM_SLOTS]
    removals: tuple[int, ...]

    def holds(self, table: Table) -> bool:
        """Whether the sums still describe ``table``: the same engine, no removal since."""
        return table is self.table and removal_counts(table) == self.removals

    def checksums(self) -> Checksums:
        wanted = np.flatnonzero(self.slots)
        return Checksums(wanted, self.counts[wanted].copy(), self.sums[wanted].copy())

    def take_out(self, keys: np.ndarray) -> None:
        """The rows of ``keys`` are about to change or go: their hashes leave the sums."""
        self._add(keys, -1)

    def put_in(self, keys: np.ndarray) -> None:
        """The rows of ``keys`` are written: their hashes join the sums."""
        self._add(keys, 1)

    def erased(self, rows: int) -> None:
        """``rows`` rows were erased by the import itself (an expected removal); any other
        removal leaves the counts apart, which the next ``holds`` sees."""
        evictions, expirations, erasures = self.removals
        self.removals = (evictions, expirations, erasures + rows)

    def _add(self, keys: np.ndarray, sign: int) -> None:
        got = self.table.native_row_hashes(keys)
        assert got is not None  # start() tracks only engines that hash rows in place
        hashes, found = got
        at = slot_of(keys[found]).astype(np.intp)
        np.add.at(self.counts, at, sign)
        with np.errstate(over="ignore"):
            step = hashes[found] if sign > 0 else np.negative(hashes[found])  # wraps mod 2**64
        np.add.at(self.sums, at, step)


def start(table: Table, slots: np.ndarray) -> RunningSums | None:
    """Sums of ``slots`` as they are now (caller holds the table's lock); None where they
    cannot be kept (an engine that does not hash rows in place, rows that expire)."""
    removals = removal_counts(table)  # before the pass: a removal during it is seen
    if removals is None or not table.hashes_rows_in_place:
        return None
    native = table.native_slot_checksums(slots)
    if native is None:
        return None
    counts, sums = native
    return RunningSums(table, slots.copy(), counts, sums, removals)
