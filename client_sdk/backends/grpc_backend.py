"""The gRPC backend: a table's shards on PS nodes, called in parallel.

Shard endpoints come from the admin API's discovery document or from an
explicit ``host:port`` list in shard order. Pulls send each distinct key once,
to its owner shard, in batches of bounded size, in parallel; results come back
in input order. Updates of an adam table reach every shard on every step (an
empty update where a shard owns none of the keys) because adam's step count is
per table.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import torch

from recstore.client.backends import wire
from recstore.client.backends.base import CreateResult
from recstore.client.discovery import Discovery, discover
from recstore.client.errors import BackendError, TableNotInitialized
from recstore.client.fanout import Positions, ShardRouter
from recstore.client.specs import same_layout
from recstore.core import DType, SlotMap, SlotRange, TableSpec
from recstore.v1 import ps_pb2, ps_pb2_grpc

PS_TOKEN_ENV = "RECSTORE_PS_TOKEN"
RPC_TIMEOUT_ENV = "RECSTORE_RPC_TIMEOUT"
MAX_MESSAGE_BYTES = 256 << 20
DEFAULT_BATCH_BYTES = 8 << 20


@dataclass
class _RemoteTable:
    spec: TableSpec
    endpoints: tuple[str, ...]
    router: ShardRouter


def _slot_map_from_proto(message: Any) -> SlotMap | None:
    if not message.ranges:
        return None
    ranges = tuple(SlotRange(r.start, r.end, r.shard) for r in message.ranges)
    return SlotMap(epoch=int(message.epoch), ranges=ranges)


def _slot_map_to_proto(slot_map: SlotMap) -> Any:
    ranges = [ps_pb2.SlotRange(start=r.start, end=r.end, shard=r.shard) for r in slot_map.ranges]
    return ps_pb2.SlotMap(epoch=slot_map.epoch, ranges=ranges)


def check_shard_order(endpoints: tuple[str, ...], index: int, shard: int, shards: int) -> None:
    """The node listed ``index``-th must be shard ``index`` of ``len(endpoints)``."""
    if shards and (shard, shards) != (index, len(endpoints)):
        raise BackendError(
            f"PS node {endpoints[index]} is shard {shard} of {shards}, but it is listed as "
            f"shard {index} of {len(endpoints)}: endpoints must be given in shard order",
            code="FAILED_PRECONDITION",
        )


class GrpcBackend:
    kind = "grpc"

    def __init__(
        self,
        *,
        endpoints: tuple[str, ...] | None = None,
        admin_url: str | None = None,
        token: str | None = None,
        admin_token: str | None = None,
        rpc_timeout: float | None = None,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        if not endpoints and not admin_url:
            raise ValueError("the grpc backend needs PS endpoints or an admin API URL")
        self._endpoints = tuple(endpoints or ())
        self._admin_url = admin_url
        self._admin_token = admin_token
        token = token or os.environ.get(PS_TOKEN_ENV) or admin_token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = rpc_timeout or float(os.environ.get(RPC_TIMEOUT_ENV, "60"))
        self._max_batch_bytes = max_batch_bytes
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, ps_pb2_grpc.ParameterServerStub] = {}
        self._tables: dict[str, _RemoteTable] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="recstore-shard")

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    # -- plumbing -----------------------------------------------------------------------

    def _stub(self, endpoint: str) -> ps_pb2_grpc.ParameterServerStub:
        with self._lock:
            stub = self._stubs.get(endpoint)
            if stub is None:
                options = [
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ]
                channel = grpc.insecure_channel(endpoint, options=options)
                self._channels[endpoint] = channel
                stub = self._stubs[endpoint] = ps_pb2_grpc.ParameterServerStub(channel)
            return stub

    def _call(self, endpoint: str, method: str, request: Any, table: str) -> Any:
        try:
            return getattr(self._stub(endpoint), method)(
                request, timeout=self._timeout, metadata=self._metadata
            )
        except grpc.RpcError as error:
            call: Any = error
            raise wire.map_rpc_error(
                call.code().name,
                call.details() or "",
                call.trailing_metadata(),
                method=method,
                table=table,
                endpoint=endpoint,
            ) from error

    def _each_endpoint(
        self, endpoints: tuple[str, ...], method: str, make: Any, table: str
    ) -> list[Any]:
        futures = [
            self._pool.submit(self._call, endpoint, method, make(index), table)
            for index, endpoint in enumerate(endpoints)
        ]
        errors = [f.exception() for f in futures]
        failure = next((e for e in errors if e is not None), None)
        if failure is not None:
            raise failure
        return [f.result() for f in futures]

    def _router(self, name: str, slot_map: SlotMap, spec: TableSpec) -> ShardRouter:
        max_rows = max(1, self._max_batch_bytes // spec.row_bytes)
        return ShardRouter(
            slot_map,
            self._pool,
            max_rows=max_rows,
            refresh=lambda epoch: self._refresh(name, epoch),
        )

    # -- where tables are ---------------------------------------------------------------

    def _discover(self, name: str) -> Discovery:
        if self._admin_url:
            return discover(self._admin_url, name, self._admin_token)
        stats = self._each_endpoint(
            self._endpoints,
            "GetTableStats",
            lambda _: ps_pb2.GetTableStatsRequest(table=name),
            name,
        )
        maps = [m for m in (_slot_map_from_proto(s.slot_map) for s in stats) if m is not None]
        slot_map = (
            max(maps, key=lambda m: m.epoch) if maps else SlotMap.initial(len(self._endpoints))
        )
        spec = TableSpec.model_validate(json.loads(stats[0].spec_json))
        return Discovery(spec, self._endpoints, slot_map)

    def _locate(self, name: str) -> _RemoteTable:
        table = self._tables.get(name)
        if table is None:
            found = self._discover(name)
            assert found.spec is not None
            table = _RemoteTable(
                found.spec, found.endpoints, self._router(name, found.slot_map, found.spec)
            )
            self._tables[name] = table
        return table

    def _refresh(self, name: str, node_epoch: int) -> SlotMap:
        found = self._discover(name)
        if found.slot_map.epoch < node_epoch:
            raise BackendError(
                f"slot map of {name!r} is at epoch {found.slot_map.epoch} but a node is at "
                f"{node_epoch}; the table is being resharded, retry later",
                code="FAILED_PRECONDITION",
            )
        self._tables[name].endpoints = found.endpoints
        return found.slot_map

    # -- Backend ------------------------------------------------------------------------

    def create_table(self, spec: TableSpec) -> CreateResult:
        slot_map: SlotMap | None = None  # explicit endpoints: each node's default map
        if self._admin_url:
            found = discover(self._admin_url, spec.name, self._admin_token)
            assert found.spec is not None
            if not same_layout(spec, found.spec):  # the caller refuses it: create nothing
                return CreateResult(found.spec, created=False)
            spec, endpoints, slot_map = found.spec, found.endpoints, found.slot_map
        else:
            endpoints = self._endpoints
            spec = spec.model_copy(update={"shards": len(endpoints)})
        request = ps_pb2.CreateTableRequest(spec_json=json.dumps(spec.to_wire()))
        if slot_map is not None:
            request.slot_map.CopyFrom(_slot_map_to_proto(slot_map))
        try:
            replies = self._each_endpoint(endpoints, "CreateTable", lambda _: request, spec.name)
        except BackendError as error:
            existing = self.describe(spec.name) if error.code == "ALREADY_EXISTS" else None
            if existing is None:
                raise
            return CreateResult(existing, created=False)
        for index, reply in enumerate(replies):
            check_shard_order(endpoints, index, reply.stats.shard_index, reply.stats.num_shards)
        if slot_map is None:
            maps = [
                m
                for m in (_slot_map_from_proto(r.stats.slot_map) for r in replies)
                if m is not None
            ]
            slot_map = max(maps, key=lambda m: m.epoch) if maps else SlotMap.initial(len(endpoints))
        self._tables[spec.name] = _RemoteTable(
            spec, endpoints, self._router(spec.name, slot_map, spec)
        )
        return CreateResult(spec, created=any(reply.created for reply in replies))

    def describe(self, name: str) -> TableSpec | None:
        try:
            return self._discover(name).spec
        except TableNotInitialized:
            return None

    def drop_table(self, name: str) -> None:
        table = self._locate(name)
        self._each_endpoint(
            table.endpoints, "DropTable", lambda _: ps_pb2.DropTableRequest(table=name), name
        )
        self._tables.pop(name, None)

    def pull(self, name: str, keys: torch.Tensor) -> torch.Tensor:
        table = self._locate(name)
        unique, inverse = torch.unique(keys, return_inverse=True)
        unique_np = wire.keys_to_numpy(unique)
        dim, dtype = table.spec.embedding_dim, DType(table.spec.dtype)
        out = np.empty((len(unique_np), dim), dtype=wire.wire_dtype(dtype))

        def pull_shard(shard: int, positions: Positions, epoch: int) -> None:
            request = ps_pb2.PullRequest(
                table=name, epoch=epoch, keys=unique_np[positions].tobytes()
            )
            reply = self._call(table.endpoints[shard], "Pull", request, name)
            out[positions] = wire.decode_rows(reply.values, len(positions), dim, dtype)

        table.router.run(unique_np, pull_shard)
        return wire.rows_from_numpy(out, dtype)[inverse]

    def push(self, name: str, keys: torch.Tensor, values: torch.Tensor) -> None:
        table = self._locate(name)
        keys_np, values_np = wire.keys_to_numpy(keys), wire.rows_to_numpy(values)
        dtype = DType(table.spec.dtype).value

        def push_shard(shard: int, positions: Positions, epoch: int) -> None:
            request = ps_pb2.PushRequest(
                table=name,
                epoch=epoch,
                keys=keys_np[positions].tobytes(),
                values=values_np[positions].tobytes(),
                dtype=dtype,
                dim=table.spec.embedding_dim,
            )
            self._call(table.endpoints[shard], "Push", request, name)

        table.router.run(keys_np, push_shard)

    def update(self, name: str, keys: torch.Tensor, grads: torch.Tensor, lr: float | None) -> None:
        table = self._locate(name)
        keys_np, grads_np = wire.keys_to_numpy(keys), wire.rows_to_numpy(grads)
        grad_dtype = "float32" if grads.dtype == torch.float32 else DType(table.spec.dtype).value

        def update_shard(shard: int, positions: Positions, epoch: int) -> None:
            request = ps_pb2.UpdateRequest(
                table=name,
                epoch=epoch,
                keys=keys_np[positions].tobytes(),
                grads=grads_np[positions].tobytes(),
                grad_dtype=grad_dtype,
                dim=table.spec.embedding_dim,
            )
            if lr is not None:
                request.lr = lr
            self._call(table.endpoints[shard], "Update", request, name)

        every_shard = table.spec.optimizer.kind == "adam"
        table.router.run(keys_np, update_shard, every_shard=every_shard)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()
        self._tables.clear()
