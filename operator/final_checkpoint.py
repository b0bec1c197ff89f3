"""gRPC calls the operator makes to a table's shards: create the table, save it.

A freshly started PS node holds no tables; once a shard's pod is ready the
operator creates the table on it (CreateTable is idempotent: the same spec
again is a no-op). Before a table's pods are removed the operator asks every
serving shard for a final checkpoint (Save), so deleting an EmbeddingTable
never loses the writes since the last periodic checkpoint.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from recstore.core.spec import TableSpec
from recstore.v1 import ps_pb2, ps_pb2_grpc


@dataclass(frozen=True)
class ShardResult:
    index: int
    address: str
    ok: bool
    detail: str  # checkpoint id, "created"/"exists", or the error


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


async def _save_one(
    index: int, address: str, checkpoint_id: str, token: str | None, timeout: float
) -> ShardResult:
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            reply = await stub.Save(
                ps_pb2.SaveRequest(checkpoint_id=checkpoint_id),
                metadata=_metadata(token),
                timeout=timeout,
            )
        return ShardResult(index, address, True, reply.checkpoint.checkpoint_id)
    except grpc.aio.AioRpcError as exc:
        return ShardResult(index, address, False, f"{exc.code().name}: {exc.details()}")


async def save_all(
    shards: Sequence[tuple[int, str]],
    *,
    checkpoint_id: str,
    token: str | None,
    timeout: float = 300.0,
) -> list[ShardResult]:
    """Ask every (index, host:port) shard for checkpoint ``checkpoint_id``, all at once."""
    calls = (_save_one(i, a, checkpoint_id, token, timeout) for i, a in shards)
    return list(await asyncio.gather(*calls))


async def _create_one(
    index: int, address: str, spec: TableSpec, token: str | None, timeout: float
) -> ShardResult:
    request = ps_pb2.CreateTableRequest(spec_json=json.dumps(spec.to_wire()))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            reply = await stub.CreateTable(request, metadata=_metadata(token), timeout=timeout)
        return ShardResult(index, address, True, "created" if reply.created else "exists")
    except grpc.aio.AioRpcError as exc:
        return ShardResult(index, address, False, f"{exc.code().name}: {exc.details()}")


async def create_table_on(
    shards: Sequence[tuple[int, str]], spec: TableSpec, *, token: str | None, timeout: float = 30.0
) -> list[ShardResult]:
    """Create ``spec`` on every (index, host:port) shard (a no-op where it exists)."""
    calls = (_create_one(i, a, spec, token, timeout) for i, a in shards)
    return list(await asyncio.gather(*calls))
