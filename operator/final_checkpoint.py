"""gRPC calls the operator makes to a table's shards: create the table, save it, drop it.

A freshly started PS node holds no tables; once a shard's pod is ready the
operator creates the table on it (CreateTable is idempotent: the same spec
again is a no-op). Before a table's pods are removed the operator asks every
serving shard for a final checkpoint (Save), so deleting an EmbeddingTable
never loses the writes since the last periodic checkpoint; a checkpoint asked
for on demand (``recstore.operator.checkpoint_requests``) saves the same way. A
table deleted from a pool is dropped from the pool's nodes, which stay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from recstore.core.checkpoint_status import ShardCheckpoint, clip
from recstore.core.control import (
    AsyncControlClient,
    ControlError,
    Rpc,
    create_table_rpc,
    drop_table_rpc,
    save_rpc,
)
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec
from recstore.core.tls import ClientTls

R = TypeVar("R")


@dataclass(frozen=True)
class ShardResult:
    index: int
    address: str
    ok: bool
    detail: str  # "created"/"exists", or the error
    #: the failed call's status (None: it succeeded)
    code: grpc.StatusCode | None = None


async def _call_each(
    shards: Sequence[tuple[int, str]],
    rpc: Rpc[R],
    detail: Callable[[R], str],
    token: str | None,
    timeout: float,
    tls: ClientTls | None,
) -> list[ShardResult]:
    """``rpc`` on every (index, host:port) shard at once, each on a channel of its own."""

    async def one(index: int, address: str) -> ShardResult:
        try:
            async with AsyncControlClient(address, token=token, timeout=timeout, tls=tls) as client:
                reply = await client.call(rpc)
        except ControlError as error:
            return ShardResult(index, address, False, str(error), error.code)
        return ShardResult(index, address, True, detail(reply))

    return list(await asyncio.gather(*(one(i, a) for i, a in shards)))


async def save_all(
    shards: Sequence[tuple[int, str]],
    *,
    checkpoint_id: str,
    token: str | None,
    timeout: float = 300.0,
    tls: ClientTls | None = None,
    tables: Sequence[str] = (),
) -> list[ShardCheckpoint]:
    """Ask every (index, host:port) shard for checkpoint ``checkpoint_id`` of ``tables``
    (empty: every table it holds), all at once."""
    rpc = save_rpc(checkpoint_id, tables)

    async def one(index: int, address: str) -> ShardCheckpoint:
        try:
            async with AsyncControlClient(address, token=token, timeout=timeout, tls=tls) as client:
                saved = await client.call(rpc)
        except ControlError as error:
            return ShardCheckpoint(index=index, endpoint=address, error=clip(str(error)))
        return ShardCheckpoint(index=index, endpoint=address, rows=saved.rows, bytes=saved.bytes)

    return list(await asyncio.gather(*(one(i, a) for i, a in shards)))


async def create_table_on(
    shards: Sequence[tuple[int, str]],
    spec: TableSpec,
    *,
    token: str | None,
    timeout: float = 30.0,
    tls: ClientTls | None = None,
    slot_map: SlotMap | None = None,
) -> list[ShardResult]:
    """Create ``spec`` on every (index, host:port) shard (a no-op where it exists);
    ``slot_map``: the table's committed map when it was moved online."""
    rpc = create_table_rpc(spec, slot_map)
    return await _call_each(
        shards, rpc, lambda reply: "created" if reply.created else "exists", token, timeout, tls
    )


async def drop_table_on(
    shards: Sequence[tuple[int, str]],
    table: str,
    *,
    token: str | None,
    timeout: float = 30.0,
    tls: ClientTls | None = None,
) -> None:
    """Drop ``table`` from every (index, host:port) node of a pool, freeing its memory (the
    pool's other tables stay); a node that no longer holds it is done. Raises the first
    other failure (the deletion is retried)."""
    results = await _call_each(
        shards, drop_table_rpc(table), lambda _: "dropped", token, timeout, tls
    )
    failed = [r for r in results if not r.ok and r.code != grpc.StatusCode.NOT_FOUND]
    if failed:
        first = failed[0]
        raise ControlError(
            first.code or grpc.StatusCode.UNKNOWN, f"shard {first.index}: {first.detail}",
            method="DropTable", endpoint=first.address,
        )  # fmt: skip
