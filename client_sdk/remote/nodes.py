"""Calls to one PS node, and what their failures mean to the SDK.

Data-path calls go on raw message bytes, started without a thread of their own.

Pull, Push, Update, MultiPull and MultiUpdate go through ``recstore.core.wire``
(the hand-written, zero-copy protobuf codec the nodes also speak) on the node's
native channel (``native_channel``: gRPC C++, raw bytes, the GIL released while
a call is in flight), so protobuf never copies a payload on this side. A call
is either run to completion now (``blocking``: the caller's own thread waits)
or handed to a sender thread that makes the same blocking call; either way the
caller gets a waiter that returns the reply bytes or raises the SDK's error
for the failure. Control calls and the row streams go through grpcio's channel.

Updates are sent once, named: every Update, MultiUpdate and MultiPull that
carries updates gets a request id (``recstore.core.request_id``). When its
outcome is unknown (the deadline passed, the connection was lost) the same
bytes, id included, are sent again, up to ``RESENDS_ENV`` times: the node's
de-dup window applies it once. A refusal the node made before applying (e.g.
wrong owner) is left to the router; anything else is never resent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any

import grpc

from recstore.client.errors import (
    BackendError,
    TableNotInitialized,
    WriteAppliedNotDurable,
    WriteNotApplied,
)
from recstore.client.remote.native_channel import (
    DataChannel,
    Message,
    NativeRpcError,
    PendingCall,
    unreachable,
)
from recstore.core import WrongShard, wire
from recstore.core.grpc_status import applied_of, node_epoch
from recstore.core.limits import grpc_options
from recstore.core.request_id import RequestIds, id_field
from recstore.core.routing import EPOCH_METADATA_KEY
from recstore.core.tls import ClientTls, channel
from recstore.v1 import ps_pb2, ps_pb2_grpc

#: how long a data call waits for a node it cannot connect to before asking whether a
#: move took the node out of its tables (then its keys go to their new owners)
UNREACHABLE_S = 1.0
#: how a multi-table request names its tables in ``start`` (and in its errors)
TABLES_SEPARATOR = ", "
MovedAway = Callable[[str, list[str]], "int | None"]

CHANNEL_OPTIONS = [
    *grpc_options(),
    # A supervised node comes back within seconds of a crash: retry the
    # connection quickly rather than after gRPC's default 1 s .. 120 s backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
Waiter = Callable[[], bytes]
RESENDS_ENV = "RECSTORE_UPDATE_RESENDS"
DEFAULT_RESENDS = 3
#: methods whose every request writes (a MultiPull writes when it carries updates)
WRITING_METHODS = frozenset({"Update", "MultiUpdate"})
#: failures after which a request may or may not have been applied. CANCELLED: this
#: client never cancels a write it waits for, so the node did (a node stopping cancels
#: the calls still running when its drain ends), at any point of the call
AMBIGUOUS_CODES = frozenset({
    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
})  # fmt: skip


def resends_from_env() -> int:
    raw = os.environ.get(RESENDS_ENV, "")
    try:
        value = int(raw) if raw else DEFAULT_RESENDS
    except ValueError:
        raise ValueError(f"{RESENDS_ENV} must be a count >= 0, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{RESENDS_ENV} must be a count >= 0, got {value}")
    return value


def ambiguous(error: grpc.RpcError) -> bool:
    """Whether a failed write's outcome is unknown: no reply, and the node did not say."""
    call: Any = error
    return call.code() in AMBIGUOUS_CODES and applied_of(call.trailing_metadata()) is None


class NodeCalls:
    """The channel to one node: generated stub for the control plane, raw data path."""

    def __init__(
        self,
        endpoint: str,
        metadata: tuple[tuple[str, str], ...],
        timeout: float,
        senders: Executor,
        tls: ClientTls | None = None,
        request_ids: RequestIds | None = None,
        moved_away: MovedAway | None = None,
    ) -> None:
        self.endpoint = endpoint
        #: (endpoint, tables) -> the epoch of a slot map of one of ``tables`` that no
        #: longer has ``endpoint``, else None (the node is still theirs)
        self.moved_away = moved_away
        self._senders = senders
        #: the ids of this client instance, shared by its nodes
        self.request_ids = request_ids or RequestIds()
        self.resends = resends_from_env()
        #: writes sent again after an ambiguous failure (a metric for tests)
        self.resent = 0
        self.channel = channel(endpoint, tls, CHANNEL_OPTIONS)
        self.stub = ps_pb2_grpc.ParameterServerStub(self.channel)
        self.data = DataChannel(endpoint, tls, CHANNEL_OPTIONS)
        self._paths = {
            "Pull": wire.PULL, "Push": wire.PUSH, "Update": wire.UPDATE,
            "MultiPull": wire.MULTI_PULL, "MultiUpdate": wire.MULTI_UPDATE,
        }  # fmt: skip
        self._import_rows = self.channel.stream_unary(wire.SERVICE + "ImportRows")
        # Control calls (CreateTable, stats) fail fast, so a wrong endpoint is
        # reported at once. Data calls wait for a node that is restarting (up to
        # the timeout) instead of failing; a call already on the wire when the
        # node dies fails (UNAVAILABLE), and only a named write is sent again.
        self._options: dict[str, Any] = {"metadata": metadata, "timeout": timeout}
        self._data_options: dict[str, Any] = {**self._options, "wait_for_ready": True}

    def control(self, method: str, request: Any, table: str) -> Any:
        """A control-plane call (CreateTable, GetTableStats, ...) with the generated classes."""
        try:
            return getattr(self.stub, method)(request, **self._options)
        except grpc.RpcError as error:
            raise self._error(error, method, table) from error

    def export_rows(self, request: Any, table: str) -> Iterator[Any]:
        """The chunks of an ExportRows stream, as they arrive."""
        try:
            yield from self.stub.ExportRows(request, **self._data_options)
        except grpc.RpcError as error:
            raise self._error(error, "ExportRows", table) from error

    def import_rows(self, message: bytes, table: str) -> int:
        """One serialized chunk through ImportRows; returns the rows written."""
        try:
            reply = self._import_rows(iter((message,)), **self._data_options)
        except grpc.RpcError as error:
            raise self._error(error, "ImportRows", table) from error
        return int(ps_pb2.ImportRowsResponse.FromString(reply).rows)

    def start(
        self, method: str, request: bytes, table: str, *, blocking: bool,
        writes: bool | None = None, waited: bool = False,
    ) -> Waiter:  # fmt: skip
        """Send a raw ``method`` request; a waiter for the raw reply.

        ``writes`` (default: an Update or MultiUpdate): name the request and resend
        it on an ambiguous failure. ``waited``: the caller waits for it right after
        starting its others (a blocking multi call): it goes out now, in flight with
        them, and the waiting thread drives it (no sender thread).
        """
        if writes is None:
            writes = method in WRITING_METHODS
        message: Message = request
        if writes:  # the id goes out as a second slice: the body is not copied
            message = (request, id_field(method, self.request_ids.next()))
        if waited and not blocking:
            path = self._paths[method]
            try:
                started = self.data.start(path, message, **self._data_options)
            except grpc.RpcError as error:
                raise self._error(error, method, table) from error

            def collect() -> bytes:
                try:
                    return self._send(method, message, writes, table, started)
                except grpc.RpcError as error:
                    raise self._error(error, method, table) from error

            return collect
        if blocking:
            try:
                reply = self._send(method, message, writes, table)
            except grpc.RpcError as error:
                failure = self._error(error, method, table)
                failure.__cause__ = error

                def fail() -> bytes:
                    raise failure

                return fail
            return lambda: reply
        future = self._senders.submit(self._send, method, message, writes, table)

        def wait() -> bytes:
            try:
                return future.result()
            except grpc.RpcError as error:
                raise self._error(error, method, table) from error

        return wait

    def _send(
        self, method: str, request: Message, resend: bool, table: str = "",
        started: PendingCall | None = None,
    ) -> bytes:  # fmt: skip
        """One call (``started``: its first try, already in flight); a named write is sent
        again, unchanged, while its outcome is unknown.

        A node that cannot be reached for ``UNREACHABLE_S`` may be one a move took out
        of its tables (a pool shrunk): when ``moved_away`` says so, the call fails as
        refused by a wrong owner at the new map's epoch (never sent, so nothing
        applied), and the router sends its keys where they are now; otherwise the node
        is restarting and is waited for, as any node is.
        """
        path = self._paths[method]
        attempts = 0
        patience = UNREACHABLE_S if self.moved_away is not None else 0.0
        while True:
            try:
                if started is not None:
                    first, started = started, None
                    return first.wait(patience)
                return self.data.call(
                    path, request, **self._data_options, unreachable_after=patience
                )
            except grpc.RpcError as error:
                if unreachable(error):
                    assert self.moved_away is not None
                    epoch = self.moved_away(self.endpoint, table.split(TABLES_SEPARATOR))
                    if epoch is not None:
                        raise NativeRpcError(
                            grpc.StatusCode.FAILED_PRECONDITION,
                            f"PS node {self.endpoint} is unreachable and no longer serves "
                            f"{table!r} (slot-map epoch {epoch})",
                            ((EPOCH_METADATA_KEY, str(epoch)),),
                        ) from error
                    patience = 0.0  # a node restarting: wait for it
                    continue
                if not resend or attempts >= self.resends or not ambiguous(error):
                    raise
                attempts += 1
                self.resent += 1

    def _error(self, error: grpc.RpcError, method: str, table: str) -> Exception:
        call: Any = error
        return map_rpc_error(
            call.code(),
            call.details() or "",
            call.trailing_metadata(),
            method=method,
            table=table,
            endpoint=self.endpoint,
        )

    def close(self) -> None:
        self.data.close()
        self.channel.close()


def map_rpc_error(
    code: grpc.StatusCode,
    details: str,
    trailing_metadata: Any,
    *,
    method: str,
    table: str,
    endpoint: str,
) -> Exception:
    """One gRPC failure as the exception the SDK raises (or WrongShard for the router)."""
    where = f"{method} on table {table!r} at PS node {endpoint}"
    if code is grpc.StatusCode.NOT_FOUND:
        return TableNotInitialized(f"{where}: table not found ({details})", reason=details)
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        epoch = node_epoch(trailing_metadata)
        if epoch is not None:
            return WrongShard(f"{where}: {details}", epoch)
    message = f"{where} failed: {code.name}: {details}"
    applied = applied_of(trailing_metadata)
    if code is grpc.StatusCode.UNAVAILABLE and applied is False:
        return WriteNotApplied(message, code=code, reason=details)
    if code is grpc.StatusCode.DATA_LOSS and applied is True:
        return WriteAppliedNotDurable(message, code=code, reason=details)
    return BackendError(message, code=code, reason=details)
