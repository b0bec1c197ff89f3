"""Where the local provisioner reports: the admin API's node and status routes.

The operator mirrors a table's status to the admin API over HTTP; the local
provisioner does the same through this small client, so the dashboard, the
CLI and the SDK's discovery read one catalogue whichever provisioner runs. The
moments of an online move go to the audit log the same way.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from recstore.core.reshard.events import ReshardEvent
from recstore.core.tls import ClientTls, http_verify


class Reporter(Protocol):
    def register_node(
        self, table: str, shard_index: int, endpoint: str, metrics_endpoint: str
    ) -> int | None: ...

    def heartbeat(self, node_id: int, ready: bool, rows: int, memory_bytes: int) -> None: ...

    def report_status(self, table: str, status: dict[str, Any]) -> None: ...

    def record_reshard_event(self, table: str, event: ReshardEvent) -> None: ...

    def report_pool_status(self, pool: str, status: dict[str, Any]) -> None: ...


class AdminReporter:
    """Reports to an admin API with a provisioner token (no other role may write these)."""

    def __init__(
        self, base_url: str, token: str, *, timeout: float = 10.0, tls: ClientTls | None = None
    ) -> None:
        self._client = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            verify=http_verify(tls),
        )
        self._last_beat: dict[int, tuple[bool, int, int]] = {}

    def register_node(
        self, table: str, shard_index: int, endpoint: str, metrics_endpoint: str
    ) -> int | None:
        reply = self._client.post(
            "/nodes",
            json={
                "table": table,
                "shard_index": shard_index,
                "endpoint": endpoint,
                "metrics_endpoint": metrics_endpoint,
            },
        )
        reply.raise_for_status()
        return int(reply.json()["id"])

    def heartbeat(self, node_id: int, ready: bool, rows: int, memory_bytes: int) -> None:
        beat = (ready, rows, memory_bytes)
        if self._last_beat.get(node_id) == beat:
            return  # unchanged: spare the catalogue a write
        self._client.post(
            f"/nodes/{node_id}/heartbeat",
            json={"ready": ready, "rows": rows, "memory_bytes": memory_bytes},
        ).raise_for_status()
        self._last_beat[node_id] = beat

    def report_status(self, table: str, status: dict[str, Any]) -> None:
        self._client.put(f"/tables/{table}/status", json=status).raise_for_status()

    def report_pool_status(self, pool: str, status: dict[str, Any]) -> None:
        self._client.put(f"/pools/{pool}/status", json=status).raise_for_status()

    def record_reshard_event(self, table: str, event: ReshardEvent) -> None:
        reply = self._client.post(f"/tables/{table}/resharding-events", json=event.to_json())
        reply.raise_for_status()

    def close(self) -> None:
        self._client.close()
