"""Accepting the loss of what follows damage in a table's log: the operator's explicit act.

Recovery refuses a table whose log is damaged (``recstore.ps.wal.verify``). An
operator who would rather serve what the log holds intact up to the damage asks
for it (the ``RecoverTable`` RPC with ``accept_log_loss``, ``recstore recover
--accept-log-loss``): the replay stops at the damage, the intact prefix applied,
and ``cut`` makes the log on disk say the same. Every segment from the damage on
is copied whole to ``<data dir>/wal-quarantine/<log>-<time>-*/``; then the
segment holding the damage is cut where its intact records end (zeros to the
length its header records, so it does not read as cut short) and every later
one is removed, so a restart replays exactly that prefix and new writes
follow it. ``LogLoss`` says what was dropped: per segment, from which offset,
how many bytes and how many intact records the damage left unreachable.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from recstore.core.proto_convert import DroppedLog
from recstore.ps.wal.records import parse_header
from recstore.ps.wal.scan import census
from recstore.ps.wal.segment_file import read_segment
from recstore.ps.wal.segments import (
    NEWEST,
    Replay,
    fsync_path,
    generations,
    record_newest,
    segment_path,
)
from recstore.ps.wal.verify import segment_name

QUARANTINE = "wal-quarantine"  # under the data dir


@dataclass(frozen=True)
class LogLoss:
    """What accepting the loss of a damaged log dropped, and where copies of it lie."""

    damage: str
    replayed: int  # records of the intact prefix, replayed
    dropped: tuple[DroppedLog, ...]
    quarantine: Path

    @property
    def writes_dropped(self) -> int:
        return sum(d.writes for d in self.dropped)

    def describe(self) -> str:
        parts = "; ".join(
            f"segment {segment_name(d.generation)} from offset {d.offset}: {d.bytes} bytes, "
            f"{d.writes} intact writes"
            for d in self.dropped
        )
        return (
            f"replayed {self.replayed} log records up to the damage ({self.damage}); dropped "
            f"{self.writes_dropped} intact writes after it ({parts or 'no bytes'}); copies in "
            f"{self.quarantine}"
        )


def cut(directory: Path, start: int, replayed: Replay, data_dir: Path) -> LogLoss:
    """Cut the log of ``directory`` back to what ``replayed`` (from generation ``start``,
    stopped at its damage) applied; copies of everything cut go to the quarantine."""
    assert replayed.damage is not None
    first = replayed.newest if replayed.newest is not None else start
    keep = replayed.end if replayed.newest is not None else 0
    root = data_dir / QUARANTINE
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    quarantine = Path(tempfile.mkdtemp(prefix=f"{directory.name}-{stamp}-", dir=root))
    dropped: list[DroppedLog] = []
    lengths: dict[int, int | None] = {}  # the length each cut segment's header records
    for generation in generations(directory):
        if generation < first:
            continue
        path = segment_path(directory, generation)
        data, size = read_segment(path)
        kept = keep if generation == first else 0
        header = parse_header(data)
        length = header.length if header is not None else None
        written = len(data.rstrip(b"\0"))
        if written <= kept and length in (None, size):
            continue  # nothing after the prefix, and not cut short
        _copy(path, quarantine / path.name)
        writes = census(data, kept).writes
        dropped.append(DroppedLog(generation, kept, max(0, written - kept), writes))
        lengths[generation] = length
    fsync_path(quarantine)
    fsync_path(root)
    for segment in dropped:
        path = segment_path(directory, segment.generation)
        if segment.offset:
            os.truncate(path, segment.offset)
            length = lengths[segment.generation]
            if length is not None:
                os.truncate(path, length)  # zeros after the prefix, to its full length
            fsync_path(path)
        else:
            path.unlink()
    left = generations(directory)
    if left:
        record_newest(directory, left[-1])
    else:
        (directory / NEWEST).unlink(missing_ok=True)
    fsync_path(directory)
    return LogLoss(str(replayed.damage), replayed.records, tuple(dropped), quarantine)


def _copy(source: Path, target: Path) -> None:
    shutil.copyfile(source, target)
    fsync_path(target)
