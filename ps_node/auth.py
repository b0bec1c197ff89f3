"""Bearer-token check for every RPC except health and reflection.

Kubernetes probes and grpcurl discovery carry no token, so ``grpc.health.v1``
and server reflection stay open; everything else needs
``authorization: Bearer <token>`` when the node has a token configured.

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

from recstore.core.proto_convert import bearer_token_of

OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


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


class TokenAuth(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token
        # request-streaming whatever the method: gRPC reads nothing before calling it
        self._refusal = grpc.stream_unary_rpc_method_handler(_refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        if method.startswith(OPEN_PREFIXES) or is_authorized(
            handler_call_details.invocation_metadata, self._token
        ):
            return await continuation(handler_call_details)
        return self._refusal
