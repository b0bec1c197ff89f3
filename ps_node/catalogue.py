"""The durable list of tables a node hosts (spec, slot map, incarnation).

Table definitions are rare and small, so every CreateTable/DropTable rewrites
``<data_dir>/tables.json`` atomically before it is acknowledged: a restarted
node hosts the same tables whatever the durability mode. The incarnation (a
fresh id per CreateTable) tells a recreated table apart from an older one of
the same name in a checkpoint or write-ahead log.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recstore.core import SlotMap, TableSpec
from recstore.ps.wal.segments import fsync_path

FILE_NAME = "tables.json"


@dataclass(frozen=True)
class CatalogueEntry:
    spec: TableSpec
    slot_map: SlotMap
    incarnation: str
    #: rows the shard grew to while serving (online resharding gave it more slots than
    #: its start-up share): a restarted node sizes the table so, before replaying rows
    reserved_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        reserved = {"reserved_rows": self.reserved_rows} if self.reserved_rows else {}
        return {
            "spec": self.spec.to_wire(),
            "slot_map": self.slot_map.to_dict(),
            "incarnation": self.incarnation,
            **reserved,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CatalogueEntry:
        return cls(
            spec=TableSpec.model_validate(data["spec"]),
            slot_map=SlotMap.from_dict(data["slot_map"]),
            incarnation=str(data["incarnation"]),
            reserved_rows=int(data.get("reserved_rows", 0)),
        )


def load(data_dir: Path) -> dict[str, CatalogueEntry] | None:
    """The saved catalogue, or None when the node never wrote one."""
    path = data_dir / FILE_NAME
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return {name: CatalogueEntry.from_dict(entry) for name, entry in raw["tables"].items()}


def save(data_dir: Path, entries: dict[str, CatalogueEntry]) -> None:
    """Replace the catalogue atomically (write, fsync, rename, fsync dir)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    temp = data_dir / f".{FILE_NAME}.tmp"
    body = {"tables": {name: entry.to_dict() for name, entry in sorted(entries.items())}}
    with open(temp, "w") as handle:
        json.dump(body, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, data_dir / FILE_NAME)
    fsync_path(data_dir)
