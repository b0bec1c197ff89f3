"""Bearer-token check for every RPC except health and reflection.

Kubernetes probes and grpcurl discovery carry no token, so ``grpc.health.v1``
and server reflection stay open; everything else needs
``authorization: Bearer <token>`` when the node has a token configured.

A node may also have a read-only token (``--read-only-token-file``), for the
nodes that serve a trained model: its holders may read (``READ_ONLY_METHODS``:
Pull, MultiPull without carried updates, ExportRows, ListTables,
GetTableStats, ListCheckpoints, and CacheReport: a serving process's host
cache reports its counters, which changes no table) and get PERMISSION_DENIED, with nothing
changed, for every other RPC (Push, Update, MultiUpdate, ImportRows,
CreateTable, DropTable, Save, Load, RecoverTable).

The token is checked on the call's metadata, before gRPC reads the request:
a refused call gets a handler that takes its request as a stream it never
reads, so the body of an unauthenticated call (however large) is neither
received whole nor deserialized; HTTP/2 flow control keeps what is in flight
to a window, and the stream is reset when the status goes out.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from recstore import _native as _native_module
from recstore.core.proto_convert import bearer_token_of

OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
SERVICE_PREFIX = "/recstore.v1.ParameterServer/"
#: what a read-only token may call (MultiPull only when it carries no updates)
READ_ONLY_METHODS = frozenset(
    {"Pull", "MultiPull", "ExportRows", "ListTables", "GetTableStats", "ListCheckpoints",
     "CacheReport"}
)  # fmt: skip
READ_ONLY_REFUSAL = "a read-only token may not call {method}: it reads, never writes"

#: the compiled engine (no type stubs): parses a MultiPull to see its carried updates
_native: Any = _native_module


def read_token_file(path: Path) -> str:
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"auth token file {path} is empty")
    return token


def is_authorized(metadata: Any, token: str) -> bool:
    """True when the metadata carries ``authorization: Bearer <token>``."""
    given = bearer_token_of(metadata)
    # bytes, so a non-ASCII header is a wrong token rather than a TypeError
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


async def _refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
    """Refuse without reading ``requests``: a unary call's message is never received."""
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


def _refuse_write(method: str) -> grpc.RpcMethodHandler:
    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED, READ_ONLY_REFUSAL.format(method=method)
        )

    return grpc.stream_unary_rpc_method_handler(refuse)


def carries_updates(request: bytes) -> bool:
    """Whether a MultiPull request carries updates (a malformed one: False, refused later)."""
    try:
        return bool(_native.MultiRequest("MultiPull", request).update_tables)
    except ValueError:
        return False


def _pull_only(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` of MultiPull, refusing a request that carries updates."""
    serve = handler.unary_unary

    async def pull_only(request: bytes, context: grpc.aio.ServicerContext) -> Any:
        if carries_updates(request):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                READ_ONLY_REFUSAL.format(method="MultiPull with updates"),
            )
        return await serve(request, context)

    return handler._replace(unary_unary=pull_only)


class TokenAuth(grpc.aio.ServerInterceptor):
    def __init__(self, token: str, read_only_token: str | None = None) -> None:
        self._token = token
        self._read_only_token = read_only_token
        # request-streaming whatever the method: gRPC reads nothing before calling it
        self._refusal = grpc.stream_unary_rpc_method_handler(_refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        metadata = handler_call_details.invocation_metadata
        if method.startswith(OPEN_PREFIXES) or is_authorized(metadata, self._token):
            return await continuation(handler_call_details)
        if self._read_only_token is None or not is_authorized(metadata, self._read_only_token):
            return self._refusal
        name = method.removeprefix(SERVICE_PREFIX)
        if name not in READ_ONLY_METHODS or name == method:
            return _refuse_write(name)
        handler = await continuation(handler_call_details)
        return _pull_only(handler) if name == "MultiPull" and handler is not None else handler
