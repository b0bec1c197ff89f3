"""A table's log directory: segments named by generation, what they cover, replay.

A log is a directory of segments ``<generation>.wal`` (records framed by
``recstore.ps.wal``). A checkpoint rotates to a new segment and records its
generation; segments are deleted only below the generation of the oldest
checkpoint kept (``recstore.ps.persistence``), so a damaged newer checkpoint
can be passed over and an older one brought forward by the log
(``reaches_back``). Replay applies the records of every segment from a
generation on, in order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from recstore.ps.dedup import Entry
from recstore.ps.wal import OP_WINDOW, WalRecord, iter_records


def segment_path(directory: Path, generation: int) -> Path:
    return directory / f"{generation:012d}.wal"


def generations(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.wal") if p.stem.isdigit())


def reaches_back(directory: Path, generation: int) -> bool:
    """Whether every segment from ``generation`` to the newest is there, so that a
    replay from ``generation`` brings back every write logged since."""
    present = [g for g in generations(directory) if g >= generation]
    return bool(present) and present == list(range(generation, present[-1] + 1))


def replay(
    directory: Path,
    start_generation: int,
    apply: Callable[[WalRecord], None],
    window: Callable[[tuple[Entry, ...]], None] | None = None,
) -> int:
    """Apply every write record of segments >= ``start_generation`` in order; returns
    their count. Window records go to ``window`` (skipped without one)."""
    count = 0
    for generation in generations(directory):
        if generation < start_generation:
            continue
        for record in iter_records(segment_path(directory, generation).read_bytes()):
            if record.op == OP_WINDOW:
                if window is not None:
                    window(record.window)
                continue
            apply(record)
            count += 1
    return count


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
