"""The local platform's durable record of a table's slot map and reshard job.

The local provisioner is the one writer of a table's slot map while it moves
slots (the operator keeps the same facts in the CR status). Both live in one
JSON file under the table's state directory, replaced atomically, so a
restarted provisioner reads back exactly what was committed: the map's epoch
says whether the half-done batch was committed (finish it) or not (abort it).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from recstore.core.reshard.plan import ReshardJob
from recstore.core.routing import SlotMap


class FileJobStore:
    """``recstore.core.reshard.protocol.JobStore`` on a JSON file; thread-safe."""

    def __init__(self, path: Path, initial: SlotMap) -> None:
        self.path = path
        self._lock = threading.Lock()
        if not path.exists():
            self._write({"slot_map": initial.to_dict(), "job": None}, sync=True)

    def _read(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.path.read_text())
        return data

    def _write(self, data: dict[str, Any], *, sync: bool) -> None:
        scratch = self.path.with_suffix(".tmp")
        with open(scratch, "w") as f:
            json.dump(data, f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(scratch, self.path)

    def slot_map(self) -> SlotMap:
        with self._lock:
            return SlotMap.from_dict(self._read()["slot_map"])

    def job(self) -> ReshardJob | None:
        with self._lock:
            raw = self._read()["job"]
        return None if raw is None else ReshardJob.from_dict(raw)

    def save_job(self, job: ReshardJob | None) -> None:
        with self._lock:
            data = self._read()
            data["job"] = None if job is None else job.to_dict()
            # not synced: a job record one phase behind is still resumed right, since
            # the committed epoch (synced) decides whether its batch is finished
            self._write(data, sync=False)

    def commit(self, expected_epoch: int, slot_map: SlotMap) -> bool:
        with self._lock:
            data = self._read()
            if int(data["slot_map"]["epoch"]) != expected_epoch:
                return False
            data["slot_map"] = slot_map.to_dict()
            self._write(data, sync=True)  # the commit point
            return True
