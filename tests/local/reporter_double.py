"""A Reporter for the local provisioner's tests: keeps each table's (and pool's) latest
status and wakes whoever waits on it (the admin API's part, without the admin API)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Statuses:
    def __init__(self) -> None:
        self.latest: dict[str, dict[str, Any]] = {}
        self.pools: dict[str, dict[str, Any]] = {}
        self.changed = threading.Condition()

    def register_node(self, table: str, shard_index: int, endpoint: str, metrics: str) -> int:
        return shard_index + 1

    def heartbeat(self, node_id: int, ready: bool, rows: int, memory_bytes: int) -> None:
        pass

    def record_reshard_event(self, table: str, event: Any) -> None:
        pass

    def report_status(self, table: str, status: dict[str, Any]) -> None:
        with self.changed:
            self.latest[table] = status
            self.changed.notify_all()

    def report_pool_status(self, pool: str, status: dict[str, Any]) -> None:
        with self.changed:
            self.pools[pool] = status
            self.changed.notify_all()

    def wait_for_pool(
        self, pool: str, what: str, check: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        """``pool``'s first reported status that passes ``check`` (fails after 120 s)."""
        with self.changed:
            met = self.changed.wait_for(lambda: check(self.pools.get(pool, {})), timeout=120)
            assert met, f"pool {pool} {what}: never reported; last {self.pools.get(pool)}"
            return self.pools[pool]

    def wait_for(
        self, table: str, what: str, check: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        """``table``'s first reported status that passes ``check`` (fails after 120 s)."""
        with self.changed:
            met = self.changed.wait_for(lambda: check(self.latest.get(table, {})), timeout=120)
            assert met, f"{table} {what}: never reported; last {self.latest.get(table)}"
            return self.latest[table]

    def wait_ready(self, table: str) -> dict[str, Any]:
        return self.wait_for(table, "Ready", lambda status: status.get("phase") == "Ready")
