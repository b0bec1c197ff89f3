"""The node's gRPC server: ``recstore._native.NodeServer`` (C++), its calls served here.

The listener, TLS, message limits, health and the bearer-token rules are the
native server's (``csrc/node_server.h``): a refused call is answered on gRPC's
threads before its body is read, and no Python runs for it. An admitted call
comes to the node's event loop as an event (the server's eventfd is one of the
loop's readers); this module runs its handler as a task and answers through the
call's handle. A handler is what a ``grpc.aio`` servicer method is: it takes the
request (bytes, or an async iterator of them for a streamed request) and a
context whose ``abort`` ends the call with a status, and returns its reply
(or yields each one of a streamed reply). A call cancelled by its client (or by
the end of the shutdown's grace) is ended natively at once; its task is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from recstore import _native as _native_module
from recstore.core.limits import DEFAULT_MESSAGE_LIMIT
from recstore.core.tls import ServerTls

log = logging.getLogger(__name__)

#: the compiled engine (no type stubs)
_native: Any = _native_module
Event: Any = _native.ServerEvent
Metadata = Sequence[tuple[str, str]]


class Aborted(Exception):
    """Raised by ``Context.abort``: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing = trailing


class Context:
    """What a handler may do to its call besides answering: end it with a status."""

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing: Metadata = ()
    ) -> NoReturn:
        raise Aborted(code, details, trailing)


@dataclass(frozen=True)
class Method:
    """How one method is served: its handler, and how its messages are read and written."""

    handler: Callable[[Any, Context], Any]  # a coroutine, or an async generator when streamed
    streamed_request: bool = False
    streamed_reply: bool = False
    read: Callable[[bytes], Any] = bytes  # a request message from its bytes
    write: Callable[[Any], bytes] | None = None  # None: the handler's replies are bytes


@dataclass(frozen=True)
class Access:
    """The token rules the native server applies (``csrc/node_server.h``, AccessRules)."""

    token: str | None = None
    read_only_token: str | None = None
    open_prefixes: tuple[str, ...] = ()
    service_prefix: str = ""
    read_only_methods: frozenset[str] = frozenset()
    read_only_refusal: str = ""


def _nothing() -> None:
    pass


class FastPath:
    """What the server may answer natively (``csrc/node_fast_path.h``), kept in step
    with the node: ``tables()`` lists the tables it may serve pulls of, as
    (name, validator view, version cell, what keeps the view's memory alive);
    a call of a method outside ``steady`` may change that list, so the fast path
    is suspended while one runs and published again once none does."""

    def __init__(
        self,
        tables: Callable[[], list[tuple[str, tuple[Any, ...], Any, Any]]],
        steady: frozenset[str],
    ) -> None:
        self.tables = tables
        self.steady = steady


class _Stream:
    """One call's pending read or write, settled by the server's events."""

    def __init__(self) -> None:
        self.read: asyncio.Future[bytes | None] | None = None
        self.written: asyncio.Future[bool] | None = None
        self.task: asyncio.Task[None] | None = None


class NativeServer:
    def __init__(
        self,
        methods: Mapping[str, Method],
        address: str,
        options: Sequence[tuple[str, int | str]],
        access: Access,
        tls: ServerTls | None = None,
        reply_limit: int = DEFAULT_MESSAGE_LIMIT,
        fast_path: FastPath | None = None,
        latency_bounds: Sequence[float] = (),
    ) -> None:
        self._methods = dict(methods)
        self._address = address
        self._options = list(options)
        self._access = access
        self._tls = tls
        self._server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: dict[Any, _Stream] = {}
        self._reply_limit = reply_limit
        self._latency_bounds = list(latency_bounds)
        self._fast_path = fast_path
        self._changing = 0  # calls in flight that may change what the fast path serves
        self._suspended: asyncio.Future[None] | None = None
        self._published: list[Any] = []  # what keeps the published views' memory alive

    async def start(self) -> int:
        """Listen and serve; returns the port."""
        tls = None
        if self._tls is not None:
            key, cert, ca = self._tls.pems()
            tls = (key.decode(), cert.decode(), ca.decode() if ca else "")
        a = self._access
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.run_in_executor(
            None,
            lambda: _native.NodeServer(
                self._address,
                self._options,
                tls,
                a.token or "",
                a.read_only_token or "",
                list(a.open_prefixes),
                a.service_prefix,
                set(a.read_only_methods),
                a.read_only_refusal,
                {path for path, m in self._methods.items() if m.streamed_request},
                self._reply_limit,
                self._latency_bounds,
            ),
        )
        self._loop.add_reader(self._server.events_fd, self._take_events)
        self.publish()
        return int(self._server.port)

    def publish(self) -> None:
        """Serve natively the pulls of what the node's tables are now (none without a
        fast path, or while a call that may change them runs)."""
        if self._fast_path is None or self._changing:
            return
        tables = self._fast_path.tables()
        self._server.publish([(name, view, version) for name, view, version, _ in tables])
        self._published = [keep for *_, keep in tables]

    def fast_counts(self) -> tuple[list[Any], list[Any]]:
        """What the fast path served since the last take: (table, method, rows) and
        (method, calls, seconds, calls per latency bucket) tuples."""
        if self._server is None:
            return [], []
        rows, calls = self._server.take_fast_counts()
        return list(rows), list(calls)

    @property
    def served_natively(self) -> int:
        """Calls the fast path answered since the server started."""
        return int(self._server.served_natively) if self._server is not None else 0

    def suspend_fast_path(self) -> None:
        """Serve every call through the node's handlers until the next ``publish``;
        returns once no pull is in flight natively. Blocks: not on the event loop."""
        self._server.suspend_fast_path()

    def set_serving(self, service: str, serving: bool) -> None:
        self._server.set_serving(service, serving)

    async def stop(self, grace: float) -> None:
        """No new call; those in flight get ``grace`` seconds, then they are cancelled."""
        server, loop = self._server, self._loop
        if server is None or loop is None:
            return
        await loop.run_in_executor(None, server.shutdown, grace)
        self._take_events()
        loop.remove_reader(server.events_fd)
        for stream in list(self._calls.values()):
            if stream.task is not None:
                stream.task.cancel()

    def _take_events(self) -> None:
        for kind, call, message, ok in self._server.take_events():
            if kind == Event.CALL:
                started = self._calls[call] = _Stream()
                started.task = asyncio.ensure_future(self._serve(call, started))
                continue
            stream = self._calls.get(call)
            if stream is None:
                continue
            if kind == Event.READ and stream.read is not None and not stream.read.done():
                stream.read.set_result(message if ok else None)
            elif kind == Event.WRITTEN and stream.written is not None and not stream.written.done():
                stream.written.set_result(ok)
            elif kind == Event.CANCELLED and stream.task is not None:
                stream.task.cancel()

    async def _serve(self, call: Any, stream: _Stream) -> None:
        try:
            method = self._methods.get(call.method)
            if method is None:
                call.finish(grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!", [])
                return
            if self._fast_path is not None and call.method not in self._fast_path.steady:
                await self._changing_call(call, stream, method)
            else:
                await self._answer(call, stream, method)
        except asyncio.CancelledError:
            call.finish(grpc.StatusCode.CANCELLED.value[0], "cancelled", [])
        except Aborted as aborted:
            call.finish(
                aborted.code.value[0], aborted.details, [(k, str(v)) for k, v in aborted.trailing]
            )
        except Exception:
            log.exception("unexpected failure in %s", call.method)
            call.finish(grpc.StatusCode.UNKNOWN.value[0], "Unexpected error", [])
        finally:
            del self._calls[call]

    async def _changing_call(self, call: Any, stream: _Stream, method: Method) -> None:
        """A call that may change the tables: the fast path waits until none runs, and
        is published again before its reply goes out (a caller's next pull finds it)."""
        assert self._loop is not None
        self._changing += 1
        settled = False

        def settle() -> None:
            nonlocal settled
            if not settled:
                settled = True
                self._changing -= 1
                if not self._changing:
                    self._suspended = None
                    self.publish()

        try:
            if self._suspended is None:  # the first of them: no pull natively from now on
                self._suspended = self._loop.run_in_executor(None, self.suspend_fast_path)
            await asyncio.shield(self._suspended)
            await self._answer(call, stream, method, settle)
        finally:
            settle()

    async def _answer(
        self, call: Any, stream: _Stream, method: Method, settle: Callable[[], None] = _nothing
    ) -> None:
        """Run the handler and send what it answers; ``settle`` runs just before the
        status goes out."""
        context = Context()
        request = (
            _read_each(call, stream, method.read)
            if method.streamed_request
            else method.read(call.request())
        )
        write = method.write or _as_bytes
        if not method.streamed_reply:
            reply = await method.handler(request, context)
            settle()
            call.finish(0, "", [], write(reply))
            return
        replies: AsyncIterator[Any] = method.handler(request, context)
        async for reply in replies:
            assert self._loop is not None
            stream.written = self._loop.create_future()
            call.write(write(reply))
            if not await stream.written:
                raise asyncio.CancelledError  # the client is gone
        settle()
        call.finish(0, "", [])


async def _read_each(
    call: Any, stream: _Stream, read: Callable[[bytes], Any]
) -> AsyncIterator[Any]:
    loop = asyncio.get_running_loop()
    while True:
        stream.read = loop.create_future()
        call.read()
        message = await stream.read
        if message is None:
            return
        yield read(message)


def _as_bytes(reply: bytes) -> bytes:
    return reply
