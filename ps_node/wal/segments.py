"""A table's log directory: segments named by generation, what they cover, verified replay.

A log is a directory of segments ``<generation>.wal`` (framed by
``recstore.ps.wal.records``, each read with every check by ``recstore.ps.wal.verify``)
and ``newest``, naming the newest generation created (written once the segment
is, atomically): a newest segment deleted is missed, not taken for the end of
the log. A checkpoint rotates to a new segment and records its generation;
segments are deleted only below the generation of the oldest checkpoint kept
(``recstore.ps.checkpoint.persistence``), so a damaged newer checkpoint can be passed over
and an older one brought forward by the log (``reaches_back``).

Replay applies every record from a generation on, in order, and raises
``WalDamaged`` at the first thing wrong: a segment missing (between others, or
one ``newest`` names), a bad or out-of-order header, a damaged record, a
truncation. Only a torn tail of the newest segment is cut. With
``stop_at_damage`` it stops there instead, the intact prefix applied: the
operator's explicit choice (``recstore.ps.wal.repair``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recstore.ps.wal.dedup import Entry
from recstore.ps.wal.records import (
    HEADER_SIZE,
    MAGIC,
    NO_PREDECESSOR,
    OP_WINDOW,
    WalRecord,
    parse_header,
)
from recstore.ps.wal.segment_file import read_segment
from recstore.ps.wal.verify import SegmentReader, WalDamaged, read_through, segment_name

log = logging.getLogger(__name__)

NEWEST = "newest"


def segment_path(directory: Path, generation: int) -> Path:
    return directory / segment_name(generation)


def generations(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.wal") if p.stem.isdigit())


def record_newest(directory: Path, generation: int) -> None:
    """Say durably that segment ``generation`` was created (after it is)."""
    temporary = directory / f"{NEWEST}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{generation}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, directory / NEWEST)
    fsync_path(directory)


def newest_created(directory: Path) -> int | None:
    """The newest generation ``newest`` names (None: no marker, a log of an older release)."""
    try:
        text = (directory / NEWEST).read_text()
    except FileNotFoundError:
        return None
    try:
        return int(text.strip())
    except ValueError:
        log.warning("wal: %s holds %r, not a generation; ignored", directory / NEWEST, text)
        return None


def reaches_back(directory: Path, generation: int) -> bool:
    """Whether the log was not trimmed past ``generation``, so a replay can start there
    (what the replay then meets, a missing segment included, is ``replay``'s to check)."""
    present = generations(directory)
    if not present:
        return False
    return present[0] <= generation <= max(present[-1], newest_created(directory) or 0)


@dataclass
class Replay:
    """What a replay read: records applied, and where the intact log it read ends."""

    records: int = 0  # write records applied
    newest: int | None = None  # the newest segment with an intact header read
    end: int = 0  # where that segment's intact records end
    damage: WalDamaged | None = None  # where a replay that stops at damage stopped


def replay(
    directory: Path,
    start_generation: int,
    apply: Callable[[WalRecord], None],
    window: Callable[[tuple[Entry, ...]], None] | None = None,
    *,
    stop_at_damage: bool = False,
) -> Replay:
    """Apply every write record of segments >= ``start_generation`` in order, each
    checked; window records go to ``window`` (skipped without one). Raises
    ``WalDamaged`` at damage, unless ``stop_at_damage`` (then ``damage`` says where)."""
    outcome = Replay()
    try:
        _replay(directory, start_generation, apply, window, outcome)
    except WalDamaged as damage:
        if not stop_at_damage:
            raise
        outcome.damage = damage
    return outcome


def _replay(
    directory: Path,
    start: int,
    apply: Callable[[WalRecord], None],
    window: Callable[[tuple[Entry, ...]], None] | None,
    outcome: Replay,
) -> None:
    present = [g for g in generations(directory) if g >= start]
    marker = newest_created(directory)
    newest = max([*present, -1 if marker is None else marker])
    there = set(present)
    for generation in range(start, newest + 1):
        if generation not in there:
            raise WalDamaged(generation, 0, _missing(present, marker))
        recorded = _recorded_end(directory, generation + 1) if generation < newest else None
        reader = open_segment(directory, generation, recorded, marker)
        if generation > start and reader.predecessor_end == NO_PREDECESSOR:
            raise WalDamaged(
                generation, len(MAGIC) + 8,
                f"its header records no predecessor, but segment {generation - 1} precedes it",
            )  # fmt: skip
        outcome.newest, outcome.end = generation, reader.start
        for record in reader:
            outcome.end = reader.end
            if record.op == OP_WINDOW:
                if window is not None:
                    window(record.window)
                continue
            apply(record)
            outcome.records += 1


def _recorded_end(directory: Path, successor: int) -> int | None:
    """Where segment ``successor`` records that its predecessor's records end (None:
    it does not say, being missing, damaged, of the previous format, or first)."""
    try:
        with open(segment_path(directory, successor), "rb") as handle:
            parsed = parse_header(handle.read(HEADER_SIZE))
    except FileNotFoundError:
        return None
    if parsed is None or parsed.predecessor_end == NO_PREDECESSOR:
        return None
    return parsed.predecessor_end


def open_segment(
    directory: Path, generation: int, recorded_end: int | None, marker: int | None
) -> SegmentReader:
    """A reader of segment ``generation``'s bytes; ``marker``: the newest generation the
    log's marker names (None: no marker)."""
    data, size = read_segment(segment_path(directory, generation))
    created = None if marker is None else generation <= marker
    return SegmentReader(data, generation, recorded_end=recorded_end, size=size, created=created)


def _missing(present: list[int], marker: int | None) -> str:
    listed = ", ".join(_ranges(present)) or "none"
    said = "" if marker is None else f"; the log's marker says segment {marker} was created"
    return f"the segment is missing (segments present from there: {listed}{said})"


def _ranges(values: list[int]) -> list[str]:
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return [str(a) if a == b else f"{a}..{b}" for a, b in runs]


def records_end(directory: Path, generation: int) -> int:
    """Where the intact records of segment ``generation`` end, read as the newest is
    (a torn tail cut; a damaged one stops at the damage): what its successor records.
    ``NO_PREDECESSOR`` when its header is damaged: a replay across it then stops."""
    try:
        reader = open_segment(directory, generation, None, newest_created(directory))
    except WalDamaged:
        return NO_PREDECESSOR
    try:
        return read_through(reader).end
    except WalDamaged:
        return reader.end


def fsync_path(path: Path) -> None:
    """Make a file's contents, or a directory's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
