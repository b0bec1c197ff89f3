"""Store: the thread-safe registry of the tables one process holds."""

from __future__ import annotations

import threading

from recstore.core import TableExists, TableNotFound, TableSpec
from recstore.store.table import Table


class Store:
    def __init__(self) -> None:
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()
        #: moves whenever a table is created or dropped: what a cached view of several
        #: tables (``recstore.client.grouped``) compares to know it is still current
        self.generation = 0

    def create(
        self,
        spec: TableSpec,
        *,
        shard_index: int = 0,
        num_shards: int = 1,
        device: str = "cpu",
        min_rows: int = 0,
    ) -> Table:
        """Create a table (holding at least ``min_rows`` rows, see ``Table``); the same spec
        (and shard) again returns the existing table."""
        with self._lock:
            existing = self._tables.get(spec.name)
            if existing is not None:
                same = (
                    existing.spec == spec
                    and existing.shard_index == shard_index
                    and existing.num_shards == num_shards
                    and existing.device == device
                )
                if not same:
                    raise TableExists(f"table {spec.name!r} exists with another spec or shard")
                return existing
            table = Table(
                spec, shard_index=shard_index, num_shards=num_shards, device=device,
                min_rows=min_rows,
            )  # fmt: skip
            self._tables[spec.name] = table
            self.generation += 1
            return table

    def get(self, name: str) -> Table:
        with self._lock:
            try:
                return self._tables[name]
            except KeyError:
                raise TableNotFound(f"no table named {name!r}") from None

    def drop(self, name: str) -> None:
        with self._lock:
            if self._tables.pop(name, None) is None:
                raise TableNotFound(f"no table named {name!r}")
            self.generation += 1

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._tables)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._tables

    def __len__(self) -> int:
        with self._lock:
            return len(self._tables)
