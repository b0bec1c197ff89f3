"""Request bodies parsed as strict JSON: whatever the admin API reads is finite and shallow.

FastAPI parses a JSON body with ``json.loads``, which takes ``NaN``, ``Infinity``
and ``1e400`` (as infinity), and recurses once per level of nesting. Every router
of the API builds its routes with ``StrictJsonRoute``, whose requests parse their
body with ``recstore.core.strict_json`` instead: such a body is refused with
FastAPI's own 422 for bad JSON (``json_invalid``, the reason in ``ctx.error``)
before any route or dependency runs.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from recstore.core import strict_json


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json.loads(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is parsed by ``strict_json`` (``APIRouter(route_class=...)``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handle(StrictJsonRequest(request.scope, request.receive))

        return strict
