"""Online resharding on the local platform: a table's move to a new shard count.

A new ``shards`` in ``update_table`` (or one found on start) runs here, in a
thread of its own, ``recstore.core.migration_drive`` (the protocol of
``recstore.core.migration_run``): growing
starts the new nodes first (sized for the new count, owning no slot yet);
the batches move; shrinking stops the emptied highest shards last. The slot
map and the job live in the table's ``migration.json`` (``FileJobStore``), so
a restarted provisioner resumes: it finishes a committed batch, aborts any
other, and moves the rest. Progress goes to the status as the ``Resharding``
phase and condition; after each commit the new map is reported to the admin
API before the source starts refusing the moved slots, so a refused client
finds the new map when it refreshes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from recstore.core.migration_drive import STEP_TIMEOUT_S, Shards, move, progress
from recstore.core.routing import SlotMap
from recstore.local.migration_store import FileJobStore

__all__ = ["START_TIMEOUT_S", "STEP_TIMEOUT_S", "Shards", "job_store", "move", "progress"]

#: how long new shards may take to start serving before the move gives up (nothing moved)
START_TIMEOUT_S = 120.0


def job_store(directory: Path, served: SlotMap | None) -> FileJobStore | None:
    """The table's store: the existing one, else a new one from the nodes' map (None: unknown)."""
    path = directory / "migration.json"
    if path.exists() or served is not None:
        return FileJobStore(path, served or SlotMap.initial(1))
    return None


def remove_shard_dirs(directory: Path, start: int, end: int) -> None:
    for shard in range(start, end):
        shutil.rmtree(directory / f"shard-{shard}", ignore_errors=True)
