"""Request bodies over the configured cap are refused with 413 before they are read.

FastAPI reads and parses a request's body before the route's dependencies run,
authentication included, so without a cap anyone who can reach the service
can make it hold a body of any size. This ASGI middleware wraps the whole app
(outside every other middleware, so before authentication): a declared
``Content-Length`` over the cap is refused before the app is called and
before any of the body is read; a body without one (chunked) is counted as
it streams, and the request is refused the moment the count passes the cap,
with nothing more read. A refusal closes the connection, so the rest of the
body is not read either.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: the setting that sets the cap (``Settings.max_request_body_bytes``), as refusals name it
SETTING = "RECSTORE_MAX_REQUEST_BODY_BYTES"
CLOSE = {"Connection": "close"}


class BodyTooLarge(HTTPException):
    """A request body over the cap: 413, however far the app had got in reading it."""

    def __init__(self, size: str, limit: int) -> None:
        super().__init__(
            413, f"request body of {size} is over the limit of {limit} bytes ({SETTING})", CLOSE
        )


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, None when it has none (or one the server will refuse)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    """Refuse (413) an HTTP request whose body is over ``max_bytes``, before reading past it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _answer(BodyTooLarge(f"{declared} bytes", self.max_bytes), scope, receive, send)
            return
        await _CountedRequest(self.app, self.max_bytes, scope, receive, send).run()


class _CountedRequest:
    """One request whose body is counted as the app reads it.

    Past the cap, reading raises ``BodyTooLarge``. Layers between here and the
    route may wrap that error (a task group's ExceptionGroup) or answer it
    themselves (FastAPI's 400 for a body it could not read), so whatever the app
    does next, the answer is the 413: a response the app starts after the
    refusal is replaced by it, and an error it raises is answered with it.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.scope, self.receive, self.send = scope, receive, send
        self.received = 0
        self.refusal: BodyTooLarge | None = None
        self.started = False  # a response went out (the app's, or the 413)

    async def run(self) -> None:
        try:
            await self.app(self.scope, self.counted_receive, self.checked_send)
        except Exception:
            if self.refusal is None or self.started:
                raise
            await self.refuse()

    async def counted_receive(self) -> Message:
        if self.refusal is not None:
            raise self.refusal
        message = await self.receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.max_bytes:
                self.refusal = BodyTooLarge(f"more than {self.max_bytes} bytes", self.max_bytes)
                raise self.refusal
        return message

    async def checked_send(self, message: Message) -> None:
        if self.refusal is None:
            self.started = self.started or message["type"] == "http.response.start"
            await self.send(message)
        elif not self.started and message["type"] == "http.response.start":
            await self.refuse()
        # else: the rest of the app's answer to a refused request is dropped

    async def refuse(self) -> None:
        assert self.refusal is not None
        self.started = True
        await _answer(self.refusal, self.scope, self.receive, self.send)


async def _answer(refusal: BodyTooLarge, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse({"detail": refusal.detail}, refusal.status_code, refusal.headers)
    await response(scope, receive, send)
