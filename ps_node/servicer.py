"""The gRPC servicer: decode a request, hand the whole batch to the node, encode.

Handlers never loop over keys; they run the node's blocking batch methods on a
thread pool, wait for the write-ahead log when one is enabled, and turn
failures into status codes through ``recstore.ps.status``. No reply is built
over the node's message limit (``recstore.ps.limits``). The data path
(``FAST_METHODS``, registered without protobuf (de)serializers by
``add_to_server``) takes and returns raw message bytes, so pulled rows are
written straight into the reply; the rest use the generated classes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from recstore.core import DType, NonFiniteValues, wire
from recstore.core.limits import DEFAULT_MESSAGE_LIMIT
from recstore.core.proto_convert import (
    TableStats,
    checkpoint_to_proto,
    read_create_table_request,
    table_stats_to_proto,
)
from recstore.ps import codec, limits, native_path, persistence
from recstore.ps.checkpoint import CheckpointInfo
from recstore.ps.checkpoint_read import list_checkpoints
from recstore.ps.metrics import Metrics
from recstore.ps.node import HostedTable, Node, Refusal, WriteAck
from recstore.ps.offload import Offload
from recstore.ps.status import status_of, trailing_metadata_of
from recstore.v1 import ps_pb2, ps_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def rpc(method: Callable[..., Awaitable[Any]]) -> Handler:
    """Time and count a handler; map failures to gRPC status codes.

    A protobuf reply over the node's message limit is refused here, its size counted
    before it is serialized; the data path's raw replies were counted before they
    were allocated.
    """
    name = method.__name__

    @functools.wraps(method)
    async def handler(self: PsServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # Counted before the reply leaves: a caller that reads /metrics after its reply
        # sees its own call.
        started = time.perf_counter()
        try:
            reply = await method(self, request, context)
            if not isinstance(reply, bytes):
                limits.check_reply(reply, self.reply_limit)
        except Exception as error:
            code = status_of(error) or grpc.StatusCode.INTERNAL
            if code is grpc.StatusCode.INTERNAL:
                log.exception("unexpected failure in %s", name)
            if isinstance(error, NonFiniteValues):
                self.metrics.nonfinite_rejected.labels(error.table).inc()
            self.metrics.observe(name, code.name, time.perf_counter() - started)
            await context.abort(code, str(error), trailing_metadata_of(error))
        self.metrics.observe(name, grpc.StatusCode.OK.name, time.perf_counter() - started)
        return reply

    return handler


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
    )
    return table_stats_to_proto(stats)


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

    async def _serve_multi(self, method: str, request: bytes) -> bytes:
        """A MultiPull or MultiUpdate, checked and served by recstore.ps.native_path."""
        served = await self.offload.run_multi(
            len(request) // 4, native_path.serve, self.node, method, request, self.reply_limit
        )
        for ack in served.acks:  # acknowledged means durable: every table's record is fsynced
            await self._acknowledge(ack)
        for table, rows in served.updated:
            self.metrics.rows(table, "MultiUpdate", rows)
        for table, rows in served.pulled:
            self.metrics.rows(table, "MultiPull", rows)
        return served.reply

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.offload.run(fn, *args)

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

    # The data path: raw request bytes in, raw reply bytes out (recstore.core.wire);
    # payloads are views of the request and the pulled rows are written straight
    # into the reply message.
    @rpc
    async def Pull(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        req = wire.decode_pull_request(request)
        hosted = self.node.get(req.table)
        rows = len(codec.decode_keys(req.keys))
        value_dtype = codec.value_dtype_for(req.value_dtype, hosted.dtype)
        message, values, found = wire.pull_response_frame(
            rows, hosted.dim, value_dtype, req.read_only, limit=self.reply_limit
        )
        await self.offload.run_batch(
            rows, self.node.pull, req.table, req.keys, values, found, value_dtype
        )
        self.metrics.rows(req.table, "Pull", rows)
        return wire.finish(message)

    @rpc
    async def Push(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        req = wire.decode_push_request(request)
        ack = await self.offload.run_batch(
            len(req.keys) // 8, self.node.push, req.table, req.keys, req.values, req.dtype, req.dim
        )
        await self._acknowledge(ack)
        self.metrics.rows(req.table, "Push", ack.rows)
        return wire.encode_rows_response(ack.rows)

    @rpc
    async def Update(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        req = wire.decode_update_request(request)
        ack = await self.offload.run_batch(
            len(req.keys) // 8,
            self.node.update,
            req.table,
            req.keys,
            req.grads,
            req.grad_dtype,
            req.dim,
            req.lr,
        )
        await self._acknowledge(ack)
        self.metrics.rows(req.table, "Update", ack.rows)
        return wire.encode_rows_response(ack.rows)

    # Several tables in one call, all or nothing (recstore.ps.native_path).
    @rpc
    async def MultiPull(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._serve_multi("MultiPull", request)

    @rpc
    async def MultiUpdate(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._serve_multi("MultiUpdate", request)

    @rpc
    async def Save(self, request, context):
        info = await self._run(
            persistence.save,
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
    async def ListCheckpoints(self, request, context):
        found = await self._run(list_checkpoints, persistence.checkpoint_root(self.node))
        return ps_pb2.ListCheckpointsResponse(checkpoints=[self._public(i) for i in found])

    def _public(self, info: CheckpointInfo) -> ps_pb2.CheckpointInfo:
        """A checkpoint as replies show it: its path relative to the data dir."""
        return checkpoint_to_proto(info, root=self.node.data_dir)


#: methods whose handlers see raw request bytes and return raw reply bytes
FAST_METHODS = frozenset({"Pull", "Push", "Update", "MultiPull", "MultiUpdate"})


def add_to_server(servicer: PsServicer, server: grpc.aio.Server) -> None:
    """Register the service: the data path without protobuf, the rest as generated."""
    service = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
    handlers = {}
    for method in service.methods:
        behaviour = getattr(servicer, method.name)
        if method.name in FAST_METHODS:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(behaviour)
            continue
        request_type = getattr(ps_pb2, method.input_type.name)
        response_type = getattr(ps_pb2, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            behaviour,
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
