"""The gRPC servicer: decode a request, hand the whole batch to the node, encode.

Handlers never loop over keys; they run the node's blocking batch methods on a
thread pool, wait for the write-ahead log when one is enabled, and turn
failures into status codes through ``recstore.ps.status``. Pull, Push and
Update take and return raw message bytes (``FAST_METHODS``, registered without
protobuf (de)serializers by ``add_to_server``); the rest use the generated classes.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from recstore.core import InvalidArgument, SlotMap, SlotRange, TableNotFound, TableSpec, wire
from recstore.ps import codec, multi, persistence
from recstore.ps.checkpoint import CheckpointInfo, list_checkpoints
from recstore.ps.metrics import Metrics
from recstore.ps.node import HostedTable, Node, WriteAck
from recstore.ps.offload import Offload
from recstore.ps.status import status_of, trailing_metadata_of
from recstore.v1 import ps_pb2, ps_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def rpc(method: Callable[..., Awaitable[Any]]) -> Handler:
    """Time and count a handler; map failures to gRPC status codes."""
    name = method.__name__

    @functools.wraps(method)
    async def handler(self: PsServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await method(self, request, context)
        except Exception as error:
            code = status_of(error) or grpc.StatusCode.INTERNAL
            if code is grpc.StatusCode.INTERNAL:
                log.exception("unexpected failure in %s", name)
            await context.abort(code, str(error), trailing_metadata_of(error))
        finally:
            self.metrics.observe(name, code.name, time.perf_counter() - started)

    return handler


def slot_map_to_proto(slot_map: SlotMap) -> ps_pb2.SlotMap:
    ranges = [ps_pb2.SlotRange(start=r.start, end=r.end, shard=r.shard) for r in slot_map.ranges]
    return ps_pb2.SlotMap(epoch=slot_map.epoch, ranges=ranges)


def slot_map_from_proto(message: ps_pb2.SlotMap) -> SlotMap:
    return SlotMap(
        epoch=message.epoch,
        ranges=tuple(SlotRange(r.start, r.end, r.shard) for r in message.ranges),
    )


def stats_of(node: Node, hosted: HostedTable) -> ps_pb2.TableStats:
    table, entry = hosted.table, hosted.entry
    return ps_pb2.TableStats(
        table=entry.spec.name,
        size=table.size,
        capacity=table.capacity,
        memory_bytes=table.memory_bytes,
        dtype=hosted.dtype,
        dim=hosted.dim,
        spec_json=json.dumps(entry.spec.to_wire()),
        shard_index=node.shard_index,
        num_shards=node.num_shards,
        slot_map=slot_map_to_proto(entry.slot_map),
        engine={k: float(v) for k, v in table.stats().items()},
    )


def checkpoint_to_proto(info: CheckpointInfo) -> ps_pb2.CheckpointInfo:
    return ps_pb2.CheckpointInfo(
        checkpoint_id=info.checkpoint_id,
        path=str(info.path),
        sequence=info.sequence,
        created_unix=info.created_unix,
        tables=info.tables,
        rows=info.rows,
        bytes=info.bytes,
    )


class PsServicer(ps_pb2_grpc.ParameterServerServicer):
    def __init__(self, node: Node, offload: Offload, metrics: Metrics, keep: int = 3) -> None:
        self.node = node
        self.offload = offload
        self.metrics = metrics
        self.keep = keep

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.offload.run(fn, *args)

    async def _acknowledge(self, ack: WriteAck) -> None:
        if ack.wal is not None:
            await ack.wal.durable(ack.seq)

    @rpc
    async def CreateTable(self, request, context):
        try:
            spec = TableSpec.model_validate(json.loads(request.spec_json))
        except json.JSONDecodeError as error:
            raise ValueError(f"spec_json is not JSON: {error}") from None
        slot_map = slot_map_from_proto(request.slot_map) if request.HasField("slot_map") else None
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
        hosted = sorted(self.node.tables.items())
        return ps_pb2.ListTablesResponse(
            names=[name for name, _ in hosted], tables=[stats_of(self.node, h) for _, h in hosted]
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
        message, values, found = wire.pull_response_frame(
            rows, hosted.dim, hosted.dtype, req.read_only
        )
        await self.offload.run_batch(rows, self.node.pull, req.table, req.keys, values, found)
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

    # Several tables in one call, all or nothing (recstore.ps.multi).
    @rpc
    async def MultiPull(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        reqs, carried = wire.decode_multi_pull_carrying(request)
        shapes = []
        for index, req in enumerate(reqs):
            try:
                hosted = self.node.get(req.table)
                rows = len(codec.decode_keys(req.keys))
            except (TableNotFound, InvalidArgument) as error:
                raise multi.item_error(index, req.table, error) from None
            shapes.append((rows, hosted.dim, hosted.dtype, req.read_only))
        carried_rows: list[int] = []
        if carried:
            # Refuse a pull before the carried updates apply: then a refused request
            # changes nothing, and the client may resend all of it.
            pulls = [(req.table, req.keys, req.read_only) for req in reqs]
            await self.offload.run_multi(
                sum(s[0] * s[1] for s in shapes), multi.check_pulls, self.node, pulls
            )
            carried_rows = await self._multi_update(carried)
        message, outs = wire.multi_pull_response_frame(shapes, carried_rows=carried_rows)
        items = [
            multi.PullItem(req.table, req.keys, values, found)
            for req, (values, found) in zip(reqs, outs, strict=True)
        ]
        values = sum(shape[0] * shape[1] for shape in shapes)
        try:
            await self.offload.run_multi(values, multi.multi_pull, self.node, items)
        except Exception as error:
            if carried:  # rare (a table dropped meanwhile): say the updates are in
                raise multi.CarriedUpdatesApplied(
                    f"the {len(carried)} carried updates were applied, the pulls failed: {error}"
                ) from error
            raise
        for req, shape in zip(reqs, shapes, strict=True):
            self.metrics.rows(req.table, "MultiPull", shape[0])
        return wire.finish(message)

    @rpc
    async def MultiUpdate(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        rows = await self._multi_update(wire.decode_multi_update_request(request))
        return wire.encode_multi_rows_response(rows)

    async def _multi_update(self, requests: list[wire.UpdateRequest]) -> list[int]:
        """Apply a MultiUpdate's items (all or nothing); rows applied per item once durable."""
        items = [
            multi.UpdateItem(r.table, r.keys, r.grads, r.grad_dtype, r.dim, r.lr) for r in requests
        ]
        values = sum(len(item.grads) // 4 for item in items)  # float32 (or smaller) values
        acks = await self.offload.run_multi(values, multi.multi_update, self.node, items)
        for ack in acks:  # acknowledged means durable: every table's record is fsynced
            await self._acknowledge(ack)
        for item, ack in zip(items, acks, strict=True):
            self.metrics.rows(item.table, "MultiUpdate", ack.rows)
        return [ack.rows for ack in acks]

    @rpc
    async def Save(self, request, context):
        info = await self._run(
            persistence.save, self.node, request.checkpoint_id or None, self.keep
        )
        self.metrics.checkpointed(info)
        return ps_pb2.SaveResponse(checkpoint=checkpoint_to_proto(info))

    @rpc
    async def Load(self, request, context):
        info = await self._run(
            persistence.load, self.node, request.checkpoint_id or None, self.keep
        )
        log.info("checkpoint loaded", extra={"checkpoint": info.checkpoint_id})
        return ps_pb2.LoadResponse(checkpoint=checkpoint_to_proto(info))

    @rpc
    async def ListCheckpoints(self, request, context):
        found = await self._run(list_checkpoints, persistence.checkpoint_root(self.node))
        return ps_pb2.ListCheckpointsResponse(checkpoints=[checkpoint_to_proto(i) for i in found])


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
