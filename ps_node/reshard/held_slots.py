"""A source's seals, kept on disk so that a node killed while sealed comes back sealed.

While a source is sealed, the batch may be committed at any moment elsewhere
(the slot map lives with the provisioner), and the target then owns the slots.
A source restarted from its catalogue still holds the old map: serving those
slots again, it would accept writes the target never sees, lost once the
source learns the new map and cleans up. So a seal is written here (fsynced)
before its tail leaves the node, and a restarted node holds the slots sealed
again until the provisioner finishes the batch (the new map: refused as not
owned) or aborts it (unsealed: the source is authoritative again). A record
names the slot-map epoch it was sealed at; one older than the table's map
(the commit reached the node before it could forget the seal) is dropped.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from recstore.core.reshard.plan import ranges_mask
from recstore.ps.changes import ChangeTracker
from recstore.ps.node import Node
from recstore.ps.reshard.slots import Outgoing, mask_ranges
from recstore.ps.wal.segments import fsync_path

FILE_NAME = "seals.json"
_lock = threading.Lock()


def remember(node: Node, name: str, out: Outgoing, epoch: int) -> None:
    """Record ``name``'s seal of ``out.slots`` at slot-map ``epoch``, durably."""
    with _lock:
        seals = _read(node.data_dir)
        seals[name] = {"ranges": mask_ranges(out.slots), "target": out.target, "epoch": epoch}
        _write(node.data_dir, seals)


def forget(node: Node, name: str) -> None:
    """The seal of ``name`` ended (committed or aborted)."""
    with _lock:
        seals = _read(node.data_dir)
        if seals.pop(name, None) is not None:
            _write(node.data_dir, seals)


def restore(node: Node) -> list[str]:
    """Seal again, on a starting node, the slots it held sealed; returns those tables."""
    with _lock:
        seals = _read(node.data_dir)
        kept: dict[str, Any] = {}
        for name, seal in seals.items():
            hosted = node.tables.get(name)
            if hosted is None or hosted.entry.slot_map.epoch != int(seal["epoch"]):
                continue  # dropped, or the new map arrived: nothing to hold
            slots = ranges_mask([(int(a), int(b)) for a, b in seal["ranges"]])
            target = int(seal["target"])
            node.reshards.outgoing[name] = Outgoing(
                slots, target, ChangeTracker(slots), True, time.monotonic()
            )
            kept[name] = seal
        if kept != seals:
            _write(node.data_dir, kept)
        return sorted(kept)


def _read(data_dir: Path) -> dict[str, Any]:
    path = data_dir / FILE_NAME
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _write(data_dir: Path, seals: dict[str, Any]) -> None:
    """Replace the file atomically (write, fsync, rename, fsync dir)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    temp = data_dir / f".{FILE_NAME}.tmp"
    with open(temp, "w") as handle:
        json.dump(seals, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, data_dir / FILE_NAME)
    fsync_path(data_dir)
