"""Control-plane calls to one PS node: create, drop and recover a table, its stats, save, load.

Each call is described once, as an ``Rpc`` (method, request, how the reply is
read into core types; the conversions are ``recstore.core.proto_convert``'s).
``ControlClient`` makes it on a blocking channel, ``AsyncControlClient`` on an
asyncio one; both send the bearer token and a deadline with every call and
raise ``ControlError`` (status code, details) for every failure, so a
caller decides in one ``except`` what a failure means to it. The data path
(Pull, Push, Update) does not come here: it speaks ``recstore.core.wire``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc

from recstore.core.cache_figures import ClientCache, client_cache_to_proto
from recstore.core.errors import RecStoreError
from recstore.core.limits import grpc_options
from recstore.core.proto_convert import (
    SavedCheckpoint,
    TableRecovery,
    TableStats,
    bearer_metadata,
    checkpoint_from_proto,
    create_table_request,
    recovery_from_proto,
    table_stats_from_proto,
)
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec
from recstore.core.tls import ClientTls, aio_channel
from recstore.core.tls import channel as tls_channel
from recstore.v1 import ps_pb2, ps_pb2_grpc

R = TypeVar("R")
DEFAULT_TIMEOUT = 30.0


#: CreateTable answers that mean "not this table, not on this node", however often asked
#: (a damaged log, a GPU table on a node without a GPU, another table of that name): the
#: provisioners report them as the node's refusal instead of waiting for the shard
CREATE_REFUSALS = frozenset({
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
})  # fmt: skip


class ControlError(RecStoreError):
    """A control call that failed: ``code`` is its gRPC status code."""

    def __init__(self, code: grpc.StatusCode, details: str, *, method: str, endpoint: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.method = method
        self.endpoint = endpoint


@dataclass(frozen=True)
class Rpc(Generic[R]):
    """One control call: the stub method, its request, and how its reply is read."""

    method: str
    request: Any
    read: Callable[[Any], R]


@dataclass(frozen=True)
class Created:
    created: bool  # False: the node already had the table, with this spec
    stats: TableStats


def create_table_rpc(spec: TableSpec, slot_map: SlotMap | None = None) -> Rpc[Created]:
    """CreateTable (a no-op where the node has the table with the same spec)."""
    return Rpc(
        "CreateTable",
        create_table_request(spec, slot_map),
        lambda reply: Created(bool(reply.created), table_stats_from_proto(reply.stats)),
    )


def drop_table_rpc(name: str) -> Rpc[None]:
    return Rpc("DropTable", ps_pb2.DropTableRequest(table=name), lambda _: None)


def stats_rpc(name: str) -> Rpc[TableStats]:
    return Rpc("GetTableStats", ps_pb2.GetTableStatsRequest(table=name), table_stats_from_proto)


def cache_report_rpc(name: str, caches: Sequence[ClientCache]) -> Rpc[None]:
    """CacheReport: a client's host caches of table ``name``, their running totals."""
    request = ps_pb2.CacheReportRequest(
        table=name, caches=[client_cache_to_proto(c) for c in caches]
    )
    return Rpc("CacheReport", request, lambda _: None)


def save_rpc(checkpoint_id: str = "", tables: Sequence[str] = ()) -> Rpc[SavedCheckpoint]:
    """Save ``tables`` of the node (empty: every table); an empty id lets the node pick one."""
    return Rpc(
        "Save",
        ps_pb2.SaveRequest(checkpoint_id=checkpoint_id, tables=tables),
        lambda reply: checkpoint_from_proto(reply.checkpoint),
    )


def load_rpc(checkpoint_id: str = "") -> Rpc[SavedCheckpoint]:
    """Load a checkpoint; an empty id means the newest valid one."""
    return Rpc(
        "Load",
        ps_pb2.LoadRequest(checkpoint_id=checkpoint_id),
        lambda reply: checkpoint_from_proto(reply.checkpoint),
    )


def recover_table_rpc(name: str, *, accept_log_loss: bool = False) -> Rpc[TableRecovery]:
    """Recover a table the node refuses; ``accept_log_loss``: from its log's intact prefix."""
    return Rpc(
        "RecoverTable",
        ps_pb2.RecoverTableRequest(table=name, accept_log_loss=accept_log_loss),
        recovery_from_proto,
    )


class _NodeStub:
    """Channel, stub, metadata and deadline of one node (both clients' common part)."""

    def __init__(
        self, endpoint: str, channel: Any, owns_channel: bool, token: str | None, timeout: float
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.metadata = bearer_metadata(token)
        self._channel = channel
        self._owns_channel = owns_channel
        self._stub = ps_pb2_grpc.ParameterServerStub(channel)

    def _start(self, rpc: Rpc[Any], timeout: float | None) -> Any:
        method = getattr(self._stub, rpc.method)
        return method(
            rpc.request,
            metadata=self.metadata,
            timeout=self.timeout if timeout is None else timeout,
        )

    def _error(self, error: grpc.RpcError, rpc: Rpc[Any]) -> ControlError:
        call: Any = error  # the raised errors are grpc.Call (sync) or AioRpcError
        return ControlError(
            call.code(), call.details() or "", method=rpc.method, endpoint=self.endpoint
        )


class ControlClient(_NodeStub):
    """Blocking control calls to the node at ``endpoint`` (``host:port``).

    ``channel``: an open channel to use instead of a new one (not closed by ``close``);
    ``tls``: how a new one verifies the node (None: plaintext).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        channel: grpc.Channel | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        owned = channel is None
        channel = channel or tls_channel(endpoint, tls, grpc_options())
        super().__init__(endpoint, channel, owned, token, timeout)

    def call(self, rpc: Rpc[R], *, timeout: float | None = None) -> R:
        try:
            reply = self._start(rpc, timeout)
        except grpc.RpcError as error:
            raise self._error(error, rpc) from error
        return rpc.read(reply)

    def create_table(
        self, spec: TableSpec, slot_map: SlotMap | None = None, *, timeout: float | None = None
    ) -> Created:
        return self.call(create_table_rpc(spec, slot_map), timeout=timeout)

    def drop_table(self, name: str, *, timeout: float | None = None) -> None:
        self.call(drop_table_rpc(name), timeout=timeout)

    def stats(self, name: str, *, timeout: float | None = None) -> TableStats:
        return self.call(stats_rpc(name), timeout=timeout)

    def save(
        self, checkpoint_id: str = "", *, tables: Sequence[str] = (), timeout: float | None = None
    ) -> SavedCheckpoint:
        return self.call(save_rpc(checkpoint_id, tables), timeout=timeout)

    def load(self, checkpoint_id: str = "", *, timeout: float | None = None) -> SavedCheckpoint:
        return self.call(load_rpc(checkpoint_id), timeout=timeout)

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncControlClient(_NodeStub):
    """``ControlClient`` on an asyncio channel: ``await client.call(save_rpc(...))``."""

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        channel: grpc.aio.Channel | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        owned = channel is None
        aio = channel or aio_channel(endpoint, tls, grpc_options())
        super().__init__(endpoint, aio, owned, token, timeout)

    async def call(self, rpc: Rpc[R], *, timeout: float | None = None) -> R:
        try:
            reply = await self._start(rpc, timeout)
        except grpc.RpcError as error:
            raise self._error(error, rpc) from error
        return rpc.read(reply)

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncControlClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
