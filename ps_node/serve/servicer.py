"""The gRPC servicer: decode a request, hand the whole batch to the node, encode.

Handlers never loop over keys; they run the node's blocking batch methods on a
thread pool, wait for the write-ahead log when one is enabled, and turn
failures into status codes through ``recstore.core.grpc_status``. No reply is built
over the node's message limit (``recstore.ps.serve.limits``). The data path
(``FAST_METHODS``, served without protobuf serializers: ``methods_of``)
takes and returns raw message bytes, so pulled rows are written straight into
the reply; the rest reply with the generated classes.

Every request arrives as bytes and is read inside its handler (``rpc``): the data
path's natively, the others with ``read_message``. Bytes that are not the
method's message fail there like any bad input, as ``MalformedMessage``:
INVALID_ARGUMENT and one warning line, never gRPC's own deserializer error with
its traceback.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from recstore.core import (
    DType,
    InvalidArgument,
    MalformedMessage,
    NonFiniteValues,
    RecStoreError,
    request_id,
    wire,
)
from recstore.core.background import background_pool
from recstore.core.cache_figures import client_cache_from_proto
from recstore.core.grpc_status import status_of, trailing_metadata_of
from recstore.core.limits import DEFAULT_MESSAGE_LIMIT
from recstore.core.proto_convert import (
    TableStats,
    checkpoint_to_proto,
    read_create_table_request,
    read_message,
    recovery_to_proto,
    slot_map_from_proto,
    table_stats_to_proto,
)
from recstore.core.reshard import messages as reshard_messages
from recstore.ps import codec, named_multi, native_path, row_transfer
from recstore.ps.checkpoint import (
    persistence,
    recovery,  # fmt: skip
)
from recstore.ps.checkpoint.read import list_checkpoints
from recstore.ps.checkpoint.write import CheckpointInfo
from recstore.ps.hosted_table import HostedTable
from recstore.ps.multi import Served
from recstore.ps.node import Node, WriteAck
from recstore.ps.reshard import steps as reshard_steps
from recstore.ps.reshard.slots import mask_ranges
from recstore.ps.serve import limits
from recstore.ps.serve.metrics import Metrics
from recstore.ps.serve.native_server import Context, Method
from recstore.ps.serve.offload import Offload
from recstore.ps.tables import Refusal
from recstore.v1 import ps_pb2, ps_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
_native: Any = importlib.import_module("recstore._native")
Handler = Callable[[Any, Any, Context], Awaitable[Any]]


#: methods whose handlers see raw request bytes and return raw reply bytes
FAST_METHODS = frozenset({"Pull", "Push", "Update", "MultiPull", "MultiUpdate"})
SERVICE = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]


def request_reader(name: str) -> Callable[[Any], Any]:
    """How method ``name``'s handler reads its request: the data path's bytes as they
    are (decoded natively), another's as its message (each one of a stream)."""
    if name in FAST_METHODS:
        return lambda data: data
    method = SERVICE.methods_by_name[name]
    message_type = getattr(ps_pb2, method.input_type.name)
    if method.client_streaming:
        return lambda stream: _read_each(message_type, stream)
    return lambda data: read_message(message_type, data)


async def _read_each(message_type: Any, stream: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    async for data in stream:
        yield read_message(message_type, data)


def rpc(method: Callable[..., Awaitable[Any]]) -> Handler:
    """Read the request, time and count a handler; map failures to gRPC status codes.

    A protobuf reply over the node's message limit is refused here, its size counted
    before it is serialized; the data path's raw replies were counted before they
    were allocated.
    """
    name = method.__name__
    read = request_reader(name)

    @functools.wraps(method)
    async def handler(self: PsServicer, request: Any, context: Context) -> Any:
        # Counted before the reply leaves: a caller that reads /metrics after its reply
        # sees its own call.
        started = time.perf_counter()
        try:
            reply = await method(self, read(request), context)
            if not isinstance(reply, bytes):
                limits.check_reply(reply, self.reply_limit)
        except Exception as error:
            await self._fail(name, error, started, context)
        self.metrics.observe(name, grpc.StatusCode.OK.name, time.perf_counter() - started)
        return reply

    return handler


def streaming_rpc(method: Callable[..., AsyncIterator[Any]]) -> Handler:
    """``rpc`` for a handler that streams its replies (an async generator)."""
    name = method.__name__
    read = request_reader(name)

    @functools.wraps(method)
    async def handler(self: PsServicer, request: Any, context: Context) -> AsyncIterator[Any]:
        started = time.perf_counter()
        try:
            async for reply in method(self, read(request), context):
                limits.check_reply(reply, self.reply_limit)
                yield reply
        except Exception as error:
            await self._fail(name, error, started, context)
        self.metrics.observe(name, grpc.StatusCode.OK.name, time.perf_counter() - started)

    return handler  # type: ignore[return-value]


def stats_of(node: Node, hosted: HostedTable) -> ps_pb2.TableStats:
    table, entry = hosted.table, hosted.entry
    stats = TableStats(
        table=entry.spec.name,
        size=table.size,
        capacity=table.capacity,
        memory_bytes=table.memory_bytes,
        dtype=hosted.dtype,
        dim=hosted.dim,
        spec=entry.spec,
        shard_index=node.shard_index,
        num_shards=node.num_shards,
        slot_map=entry.slot_map,
        engine=table.stats(),
        conditions=node.conditions.get(entry.spec.name, ()),
        version=hosted.version,
        client_caches=node.cache_reports.of(entry.spec.name),
    )
    message = table_stats_to_proto(stats)
    reshard_state(node, entry.spec.name, message.migration)
    return message


def reshard_state(node: Node, name: str, message: ps_pb2.MigrationState) -> None:
    """Field 14 of TableStats: what this node is moving out or importing (unset: nothing)."""
    out = node.reshards.outgoing.get(name)
    if out is not None:
        message.outgoing.extend(
            reshard_messages.ranges_to_proto(mask_ranges(out.slots), out.target)
        )
        message.sealed = out.sealed
        message.pending_changes = out.tracker.pending
    importing = node.reshards.importing.get(name)
    if importing is not None:
        ranges = mask_ranges(importing)
        message.importing.extend(reshard_messages.ranges_to_proto(ranges, node.shard_index))


def refused_stats_of(node: Node, refusal: Refusal) -> ps_pb2.TableStats:
    """A refused table as ListTables shows it: no rows, and why (its condition)."""
    entry = refusal.entry
    stats = TableStats(
        table=entry.spec.name,
        size=0,
        capacity=0,
        memory_bytes=0,
        dtype=DType(entry.spec.dtype).value,
        dim=entry.spec.embedding_dim,
        spec=entry.spec,
        shard_index=node.shard_index,
        num_shards=node.num_shards,
        slot_map=entry.slot_map,
        conditions=(refusal.condition,),
    )
    return table_stats_to_proto(stats)


class PsServicer(ps_pb2_grpc.ParameterServerServicer):
    def __init__(
        self,
        node: Node,
        offload: Offload,
        metrics: Metrics,
        keep: int = 3,
        reply_limit: int = DEFAULT_MESSAGE_LIMIT,
    ) -> None:
        self.node = node
        self.offload = offload
        self.metrics = metrics
        self.keep = keep
        #: no reply is built larger (the node's message limit, its gRPC send limit)
        self.reply_limit = reply_limit
        self.reshard_steps = ThreadPoolExecutor(max_workers=2, thread_name_prefix="reshard")
        # the engine's batch-work threads take their starter's priority: started here,
        # never by a lowered copy thread
        _native.start_workers()
        #: the copy before a seal (snapshot pages, catch-up rounds): trainers' requests first
        self.reshard_copy = background_pool(2, "reshard-copy")

    async def _serve_multi(self, method: str, request: bytes) -> bytes:
        """A MultiPull or MultiUpdate, checked and served by recstore.ps.native_path."""
        named = request_id.read(method, request)
        serve: Callable[..., Served] = native_path.serve
        args: tuple[Any, ...] = (self.node, method, request, self.reply_limit)
        if named is not None:
            serve, args = named_multi.serve, (*args, named)
        if self.node.reshards.outgoing:  # it may be held by a seal: never on the loop
            served = await self.offload.run(serve, *args)
        else:
            served = await self.offload.run_multi(len(request) // 4, serve, *args)
        for ack in served.acks:  # acknowledged means durable: every table's record is fsynced
            await self._acknowledge(ack)
        for table, rows in served.updated:
            hosted = self.node.tables.get(table)
            if hosted is not None:  # applied by the engine itself: its version moves here
                hosted.wrote()
            self.metrics.rows(table, "MultiUpdate", rows)
        for table, rows in served.pulled:
            self.metrics.rows(table, "MultiPull", rows)
        return served.reply

    async def _fail(self, name: str, error: Exception, started: float, context: Context) -> None:
        """Count a failed call and end it with the status its error maps to."""
        code = status_of(error) or grpc.StatusCode.INTERNAL
        if code is grpc.StatusCode.INTERNAL:
            log.exception("unexpected failure in %s", name)
        elif isinstance(error, MalformedMessage):  # the sender's fault: no traceback
            log.warning("%s refused: %s", name, error)
        if isinstance(error, NonFiniteValues):
            self.metrics.nonfinite_rejected.labels(error.table).inc()
        self.metrics.observe(name, code.name, time.perf_counter() - started)
        await context.abort(code, str(error), trailing_metadata_of(error))

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.offload.run(fn, *args)

    async def _batch(self, table: str, rows: int, fn: Callable[..., T], *args: Any) -> T:
        """A data-path call; on the pool when the table moves slots out (a seal may hold
        it, which must not stop the event loop)."""
        if self.node.reshards.tracks(table):
            return await self.offload.run(fn, *args)
        return await self.offload.run_batch(rows, fn, *args)

    async def _step(self, fn: Callable[..., T], *args: Any, copy: bool = False) -> T:
        """A reshard step, on threads of its own: requests held by a seal may fill the pool.

        ``copy``: rows moved before the seal, on the background threads."""
        loop = asyncio.get_running_loop()
        pool = self.reshard_copy if copy else self.reshard_steps
        return await loop.run_in_executor(pool, functools.partial(fn, *args))

    async def _acknowledge(self, ack: WriteAck) -> None:
        if ack.wal is not None:
            await ack.wal.durable(ack.seq)

    @rpc
    async def CreateTable(self, request, context):
        spec, slot_map = read_create_table_request(request)
        hosted, created = await self._run(self.node.create_table, spec, slot_map)
        if created:
            log.info("table created", extra={"table": spec.name})
        return ps_pb2.CreateTableResponse(created=created, stats=stats_of(self.node, hosted))

    @rpc
    async def DropTable(self, request, context):
        await self._run(self.node.drop_table, request.table)
        log.info("table dropped", extra={"table": request.table})
        return ps_pb2.DropTableResponse()

    @rpc
    async def ListTables(self, request, context):
        node = self.node
        tables = {n: stats_of(node, h) for n, h in list(node.tables.items())}
        tables |= {n: refused_stats_of(node, r) for n, r in list(node.refused.items())}
        return ps_pb2.ListTablesResponse(
            names=sorted(tables), tables=[tables[n] for n in sorted(tables)]
        )

    @rpc
    async def GetTableStats(self, request, context):
        return stats_of(self.node, self.node.get(request.table))

    @rpc
    async def CacheReport(self, request, context):
        self.node.get(request.table)  # NOT_FOUND for a table this node does not host
        caches = [client_cache_from_proto(c) for c in request.caches]
        self.node.cache_reports.report(request.table, caches)
        return ps_pb2.CacheReportResponse()

    # The data path: raw request bytes in, raw reply bytes out (recstore.core.wire);
    # payloads are views of the request and the pulled rows are written straight
    # into the reply message.
    @rpc
    async def Pull(self, request: bytes, context: Context) -> bytes:
        req = wire.decode_pull_request(request)
        hosted = self.node.get(req.table)
        version = hosted.version  # before the rows are read: they are at least this new
        rows = len(codec.decode_keys(req.keys))
        value_dtype = codec.value_dtype_for(req.value_dtype, hosted.dtype)
        message, values, found = wire.pull_response_frame(
            rows, hosted.dim, value_dtype, req.read_only, version=version, limit=self.reply_limit
        )
        await self._batch(
            req.table, rows, self.node.pull, req.table, req.keys, values, found, value_dtype
        )
        self.metrics.rows(req.table, "Pull", rows)
        return wire.finish(message)

    @rpc
    async def Push(self, request: bytes, context: Context) -> bytes:
        req = wire.decode_push_request(request)
        ack = await self._batch(
            req.table, len(req.keys) // 8, self.node.push,
            req.table, req.keys, req.values, req.dtype, req.dim,
        )  # fmt: skip
        await self._acknowledge(ack)
        self.metrics.rows(req.table, "Push", ack.rows)
        return wire.encode_rows_response(ack.rows)

    @rpc
    async def Update(self, request: bytes, context: Context) -> bytes:
        req = wire.decode_update_request(request)
        ack = await self._batch(
            req.table,
            len(req.keys) // 8,
            self.node.update,
            req.table,
            req.keys,
            req.grads,
            req.grad_dtype,
            req.dim,
            req.lr,
            request_id.read("Update", request),
        )
        await self._acknowledge(ack)
        self.metrics.rows(req.table, "Update", ack.rows)
        return wire.encode_rows_response(ack.rows)

    # Several tables in one call, all or nothing (recstore.ps.native_path).
    @rpc
    async def MultiPull(self, request: bytes, context: Context) -> bytes:
        return await self._serve_multi("MultiPull", request)

    @rpc
    async def MultiUpdate(self, request: bytes, context: Context) -> bytes:
        return await self._serve_multi("MultiUpdate", request)

    @rpc
    async def Save(self, request, context):
        info = await self._run(
            functools.partial(persistence.save, tables=tuple(request.tables)),
            self.node,
            request.checkpoint_id or None,
            self.keep,
            self.metrics.checkpoint_damaged,
        )
        self.metrics.checkpointed(info)
        return ps_pb2.SaveResponse(checkpoint=self._public(info))

    @rpc
    async def Load(self, request, context):
        self.node.write_gate.check()  # a load replaces tables: refused while writes are stopped
        info = await self._run(
            persistence.load,
            self.node,
            request.checkpoint_id or None,
            self.keep,
            self.metrics.checkpoint_damaged,
        )
        log.info("checkpoint loaded", extra={"checkpoint": info.checkpoint_id})
        return ps_pb2.LoadResponse(checkpoint=self._public(info))

    @rpc
    async def RecoverTable(self, request, context):
        self.node.write_gate.check()  # it opens the table's log: refused while writes stop
        recovered = await self._run(
            functools.partial(
                recovery.recover_refused, self.node, request.table,
                accept_log_loss=request.accept_log_loss,
                on_damaged=self.metrics.checkpoint_damaged,
            )
        )  # fmt: skip
        log.info("table recovered", extra={"table": recovered.table, "how": recovered.how})
        return recovery_to_proto(recovered)

    @rpc
    async def ListCheckpoints(self, request, context):
        found = await self._run(list_checkpoints, persistence.checkpoint_root(self.node))
        return ps_pb2.ListCheckpointsResponse(checkpoints=[self._public(i) for i in found])

    # -- online resharding (recstore.ps.reshard.steps) -------------------------------
    def _rows(self, name: str, rows: reshard_messages.RowBatch) -> ps_pb2.MigrationRows:
        return reshard_messages.rows_to_proto(rows, self.node.get(name).dtype)

    @rpc
    async def MigrateBegin(self, request, context):
        ranges = reshard_messages.ranges_from_proto(request.slots)
        if request.role == reshard_messages.SOURCE:
            targets = {r.shard for r in request.slots}
            if len(targets) != 1:
                raise InvalidArgument("a source moves its slots to exactly one target shard")
            await self._step(
                reshard_steps.begin_outgoing, self.node, request.table, ranges, targets.pop()
            )
            out = self.node.reshards.outgoing_of(request.table)
            return ps_pb2.MigrateBeginResponse(snapshot_rows=len(out.snapshot))
        if request.role == reshard_messages.TARGET:
            await self._step(reshard_steps.begin_import, self.node, request.table, ranges)
            return ps_pb2.MigrateBeginResponse()
        raise InvalidArgument(f"unknown reshard role {request.role}")

    @rpc
    async def MigrateRows(self, request, context):
        if request.changes:
            # the rest of a tail (read while sealed) is part of the write pause
            sealed = reshard_steps.is_sealed(self.node, request.table)
            rows = await self._step(
                reshard_steps.catch_up, self.node, request.table, copy=not sealed
            )
        else:
            rows = await self._step(
                reshard_steps.snapshot_page, self.node, request.table,
                int(request.offset), int(request.max_rows), copy=True,
            )  # fmt: skip
        return self._rows(request.table, rows)

    @rpc
    async def SealSlots(self, request, context):
        timeout = request.timeout_seconds
        if not timeout > 0:
            raise InvalidArgument(f"timeout_seconds must be > 0, got {timeout}")
        rows = await self._step(
            reshard_steps.seal, self.node, request.table, timeout, request.with_checksums
        )
        return self._rows(request.table, rows)

    @rpc
    async def MigrateImport(self, request, context):
        hosted = self.node.get(request.table)
        try:
            rows = reshard_messages.rows_from_proto(
                request.rows, hosted.dtype, hosted.dim, hosted.entry.spec.state_width
            )
        except ValueError as error:
            raise InvalidArgument(f"table {request.table!r}: {error}") from None
        # a tail (and the import whose checksums the verify waits for) is in the write pause
        in_pause = request.rows.tail or request.with_checksums
        ack = await self._step(
            reshard_steps.import_rows, self.node, request.table, rows, copy=not in_pause
        )
        await self._acknowledge(ack)
        reply = ps_pb2.MigrateImportResponse(rows=ack.rows)
        if request.with_checksums:
            sums = await self._step(reshard_steps.importing_checksums, self.node, request.table)
            reply.checksums.CopyFrom(reshard_messages.checksums_to_proto(sums))
        return reply

    @rpc
    async def MigrateAbort(self, request, context):
        if request.role == reshard_messages.SOURCE:
            aborted = await self._step(reshard_steps.abort_outgoing, self.node, request.table)
        elif request.role == reshard_messages.TARGET:
            await self._step(reshard_steps.abort_import, self.node, request.table)
            aborted = True
        else:
            raise InvalidArgument(f"unknown reshard role {request.role}")
        return ps_pb2.MigrateAbortResponse(aborted=aborted)

    @rpc
    async def MigrateCleanup(self, request, context):
        dropped = await self._step(reshard_steps.cleanup, self.node, request.table)
        return ps_pb2.MigrateCleanupResponse(rows=dropped)

    @rpc
    async def SlotChecksums(self, request, context):
        ranges = reshard_messages.ranges_from_proto(request.slots)
        sums = await self._step(reshard_steps.checksums, self.node, request.table, ranges)
        return reshard_messages.checksums_to_proto(sums)

    @rpc
    async def SetSlotMap(self, request, context):
        try:
            slot_map = slot_map_from_proto(request.slot_map)
        except ValueError as error:
            raise InvalidArgument(f"table {request.table!r}: bad slot map: {error}") from None
        ranges = reshard_messages.ranges_from_proto(request.checksum_slots)
        done = await self._step(
            reshard_steps.activate, self.node, request.table, request.expected_epoch, slot_map,
            ranges,
        )  # fmt: skip
        reply = ps_pb2.SetSlotMapResponse(changed=done.changed, held_seconds=done.held_s)
        if done.checksums is not None:
            reply.checksums.CopyFrom(reshard_messages.checksums_to_proto(done.checksums))
        return reply

    # Rows with their optimizer state, streamed (recstore.ps.row_transfer).
    @streaming_rpc
    async def ExportRows(self, request, context):
        chunks = await self._run(
            functools.partial(
                row_transfer.export_rows,
                self.node,
                request.table,
                with_state=request.with_state,
                slot_mask=request.slot_mask,
                keys=request.keys,
                max_chunk_bytes=request.max_chunk_bytes,
                reply_limit=self.reply_limit,
            )
        )
        hosted = self.node.get(request.table)
        while (chunk := await self._run(next, chunks, None)) is not None:
            self.metrics.rows(request.table, "ExportRows", chunk.rows)
            yield ps_pb2.ExportRowsChunk(
                table=request.table,
                keys=chunk.keys,
                values=chunk.values,
                state=chunk.state,
                dtype=hosted.dtype,
                dim=hosted.dim,
                state_width=chunk.state_width,
            )

    @rpc
    async def ImportRows(self, requests, context):
        rows = chunks = 0
        async for chunk in requests:
            write = functools.partial(
                row_transfer.import_rows,
                self.node,
                chunk.table,
                chunk.keys,
                chunk.values,
                chunk.state,
                dtype=chunk.dtype,
                dim=chunk.dim,
                state_width=chunk.state_width,
                optimizer_step=(chunk.optimizer_step if chunk.HasField("optimizer_step") else None),
            )
            try:
                ack = await self._batch(chunk.table, len(chunk.keys) // 8, write)
                await self._acknowledge(ack)
            except RecStoreError as error:
                if chunks:  # the caller learns what of its stream is in the table
                    note = f" ({rows} rows of the {chunks} chunks before this one were applied)"
                    error.args = (f"{error}{note}", *error.args[1:])
                raise
            rows, chunks = rows + ack.rows, chunks + 1
            self.metrics.rows(chunk.table, "ImportRows", ack.rows)
        return ps_pb2.ImportRowsResponse(rows=rows, chunks=chunks)

    def _public(self, info: CheckpointInfo) -> ps_pb2.CheckpointInfo:
        """A checkpoint as replies show it: its path relative to the data dir."""
        return checkpoint_to_proto(info, root=self.node.data_dir)


#: methods whose calls never change which tables the server's fast path may read
#: (every other call suspends it while it runs: recstore.ps.serve.native_server.FastPath)
STEADY_METHODS = FAST_METHODS | {
    "ListTables", "GetTableStats", "ListCheckpoints", "CacheReport", "SlotChecksums",
    "ExportRows", "ImportRows", "Save",
}  # fmt: skip

#: methods that stream their requests or their replies
STREAMED_REQUESTS = frozenset({"ImportRows"})
STREAMED_REPLIES = frozenset({"ExportRows"})


def methods_of(servicer: PsServicer) -> dict[str, Method]:
    """Every method of the contract, by its path: every request as bytes (``rpc``
    reads it), the data path's replies as bytes too, the others serialized from
    their generated classes."""
    out = {}
    for method in SERVICE.methods:
        reply_type = getattr(ps_pb2, method.output_type.name)
        out[f"/{SERVICE.full_name}/{method.name}"] = Method(
            getattr(servicer, method.name),
            streamed_request=method.name in STREAMED_REQUESTS,
            streamed_reply=method.name in STREAMED_REPLIES,
            write=None if method.name in FAST_METHODS else reply_type.SerializeToString,
        )
    return out
