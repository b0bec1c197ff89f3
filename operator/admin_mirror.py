"""Mirror each table's status to the admin API, when one is configured.

The admin API keeps the catalogue the SDK's discovery reads; the operator
keeps it current by ``PUT /api/v1/tables/{name}/status`` whenever a table's
status changes. Mirroring is best effort: a down admin API is logged and
retried with the next change, never a reason to hold up reconciling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from recstore.core.reconcile import admin_status
from recstore.core.tls import ClientTls, http_verify


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

    async def aclose(self) -> None:
        await self._client.aclose()

    async def put_status(
        self, table: str, status: Mapping[str, Any], logger: logging.Logger | logging.LoggerAdapter
    ) -> bool:
        """PUT the status; True when the admin API accepted it."""
        url = f"/api/v1/tables/{quote(table, safe='')}/status"
        try:
            token = self._token()
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            response = await self._client.put(url, json=admin_status(status), headers=headers)
        except httpx.HTTPError as exc:
            logger.warning(f"admin API unreachable, status of {table!r} not mirrored: {exc}")
            return False
        if response.status_code >= 400:
            logger.warning(
                f"admin API refused the status of {table!r}: "
                f"{response.status_code} {response.text[:200]}"
            )
            return False
        return True
