"""Mirror each table's status to the admin API, when one is configured.

The admin API keeps the catalogue the SDK's discovery reads; the operator
keeps it current by ``PUT /api/v1/tables/{name}/status`` whenever a table's
status changes. It authenticates as the provisioner identity, and the admin
API accepts a shard endpoint only once that shard's node is registered with
it, so each new endpoint is registered (``POST /api/v1/nodes``) first. The
moments of an online move go to the audit log
(``POST /api/v1/tables/{name}/resharding-events``). Mirroring is best effort:
a down admin API is logged and the status sent again at the next refresh, changed
or not (a moment is only logged), never a reason to hold up reconciling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from recstore.core.reshard.events import ReshardEvent
from recstore.core.status import TableStatus
from recstore.core.tls import ClientTls, http_verify

Logger = logging.Logger | logging.LoggerAdapter


class AdminMirror:
    """``token``: the token itself, or a function read at every call (a mounted Secret)."""

    def __init__(
        self,
        base_url: str,
        token: str | Callable[[], str | None] | None,
        *,
        timeout: float = 10.0,
        tls: ClientTls | None = None,
    ) -> None:
        self._token = token if callable(token) else (lambda: token)
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=timeout, verify=http_verify(tls)
        )
        #: (table, shard index) -> endpoint registered by this process.
        self._registered: dict[tuple[str, int], str] = {}
        #: tables whose last status did not reach the admin API (unreachable, or failing
        #: with a 5xx): sent again unchanged. A refusal (4xx) would be refused again.
        self._unsent: set[str] = set()

    def _headers(self) -> dict[str, str]:
        token = self._token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def aclose(self) -> None:
        await self._client.aclose()

    def behind(self, table: str) -> bool:
        """Whether the admin API has yet to take the table's last status."""
        return table in self._unsent

    async def put_status(self, table: str, status: TableStatus, logger: Logger) -> bool:
        """Register new shard endpoints, then PUT the status; True when both were accepted.

        A slot map in ``status`` goes too: a table moved online is routed by the committed
        map, the one clients must use."""
        self._unsent.add(table)  # until the admin API has answered
        body = status.to_wire()
        try:
            for shard in body["shards"]:
                refusal = await self._register(table, shard)
                if refusal is not None:
                    return self._answered(table, refusal, f"node {shard['endpoint']}", logger)
            response = await self._client.put(
                f"/api/v1/tables/{quote(table, safe='')}/status",
                json=body,
                headers=self._headers(),
            )
        except httpx.HTTPError as exc:
            logger.warning(f"admin API unreachable, status of {table!r} not mirrored: {exc}")
            return False
        # a shard this status leaves out was removed by a shrink, and the admin API forgets
        # its node: if the table grows again, the shard's node is registered anew
        listed = {shard.index for shard in status.shards}
        for key in [k for k in self._registered if k[0] == table and k[1] not in listed]:
            del self._registered[key]
        return self._answered(table, response, "the status", logger)

    def _answered(self, table: str, response: httpx.Response, what: str, logger: Logger) -> bool:
        """Whether the admin API took it; a 5xx leaves the table's status to be sent again."""
        if response.status_code < 500:
            self._unsent.discard(table)
        return _accepted(response, f"{what} of {table!r}", logger)

    async def post_event(self, table: str, event: ReshardEvent, logger: Logger) -> bool:
        """Record a moment of the table's move in the audit log; True when accepted."""
        try:
            response = await self._client.post(
                f"/api/v1/tables/{quote(table, safe='')}/resharding-events",
                json=event.to_json(),
                headers=self._headers(),
            )
        except httpx.HTTPError as exc:
            logger.warning(
                f"admin API unreachable, {event.action} of {table!r} not recorded: {exc}"
            )
            return False
        return _accepted(response, f"{event.action} of {table!r}", logger)

    async def _register(self, table: str, shard: Mapping[str, Any]) -> httpx.Response | None:
        """Register the shard's node unless this process did; the answer when it refused."""
        index, endpoint = int(shard["index"]), shard.get("endpoint")
        if not endpoint or self._registered.get((table, index)) == endpoint:
            return None
        response = await self._client.post(
            "/api/v1/nodes",
            json={"table": table, "shard_index": index, "endpoint": endpoint},
            headers=self._headers(),
        )
        if response.status_code >= 400:
            return response
        self._registered[(table, index)] = endpoint
        return None


def _accepted(response: httpx.Response, what: str, logger: Logger) -> bool:
    if response.status_code >= 400:
        logger.warning(f"admin API refused {what}: {response.status_code} {response.text[:200]}")
        return False
    return True
