"""A table's rows with their optimizer state to and from its PS nodes (ExportRows/ImportRows).

An export streams each shard's resident rows in chunks the node bounds in
bytes, shard after shard, so a table is never held whole here. An import
splits each chunk by owner shard (the slot map of ``recstore.core``) and
writes every part with ImportRows; a node that no longer owns some slots
refuses the part whole, and the router refreshes the slot map and resends it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from recstore.client.backends.base import RowChunk
from recstore.client.remote.nodes import NodeCalls
from recstore.client.remote.tables import RemoteTable
from recstore.client.tensors import keys_to_numpy, rows_from_numpy, rows_to_numpy
from recstore.core import DType, wire
from recstore.core.limits import ROW_CHUNK_BYTES
from recstore.v1 import ps_pb2


def slot_mask_bytes(slots: np.ndarray | None) -> bytes:
    """A bool mask over the routing slots as ExportRows takes it (empty: every slot)."""
    return b"" if slots is None else slots.astype(np.uint8).tobytes()


def chunk_of(reply: ps_pb2.ExportRowsChunk, dtype: DType) -> RowChunk:
    """An exported chunk as tensors (copies: the reply's buffers are immutable bytes)."""
    keys = torch.from_numpy(wire.keys_view(reply.keys).copy())
    rows = wire.rows_view(reply.values, len(keys), reply.dim, dtype.value, "values").copy()
    state = None
    if reply.state_width:
        raw = wire.rows_view(reply.state, len(keys), reply.state_width, "float32", "state")
        state = torch.from_numpy(raw.copy())
    return RowChunk(keys, rows_from_numpy(rows, dtype), state)


def export_table(
    table: RemoteTable, node: Callable[[str], NodeCalls], with_state: bool, slots: bytes
) -> Iterator[RowChunk]:
    """Every shard's rows, shard after shard."""
    dtype = DType(table.spec.dtype)
    for endpoint in table.endpoints:
        request = ps_pb2.ExportRowsRequest(
            table=table.name,
            epoch=table.router.slot_map.epoch,
            with_state=with_state,
            slot_mask=slots,
            max_chunk_bytes=ROW_CHUNK_BYTES,
        )
        for reply in node(endpoint).export_rows(request, table.name):
            yield chunk_of(reply, dtype)


def export_keys(
    table: RemoteTable,
    node: Callable[[str], NodeCalls],
    with_state: bool,
    slots: bytes,
    keys: np.ndarray,
) -> Iterator[RowChunk]:
    """The resident rows of ``keys``, asked of their owner shards."""
    dtype = DType(table.spec.dtype)

    def export(shard: int, positions: np.ndarray, epoch: int) -> list[RowChunk]:
        request = ps_pb2.ExportRowsRequest(
            table=table.name,
            epoch=epoch,
            with_state=with_state,
            slot_mask=slots,
            keys=keys[positions].tobytes(),
            max_chunk_bytes=ROW_CHUNK_BYTES,
        )
        replies = node(table.endpoints[shard]).export_rows(request, table.name)
        return [chunk_of(reply, dtype) for reply in replies]

    for result in table.router.run(keys, export):
        yield from result.value


def step_message(table: RemoteTable, step: int) -> bytes:
    """An ImportRows message of no rows that sets the table's optimizer step count."""
    return ps_pb2.ExportRowsChunk(
        table=table.name,
        dtype=DType(table.spec.dtype).value,
        dim=table.spec.embedding_dim,
        optimizer_step=step,
    ).SerializeToString()


def part_message(table: RemoteTable, chunk: RowChunk, positions: np.ndarray, epoch: int) -> bytes:
    """The ImportRows message of the rows at ``positions`` of ``chunk``."""
    keys = keys_to_numpy(chunk.keys)[positions]
    values = rows_to_numpy(chunk.values)[positions]
    state = b""
    width = 0
    if chunk.state is not None:
        state_rows = chunk.state.numpy()[positions]
        state, width = state_rows.astype("<f4", copy=False).tobytes(), state_rows.shape[1]
    return ps_pb2.ExportRowsChunk(
        table=table.name,
        epoch=epoch,
        keys=keys.tobytes(),
        values=np.ascontiguousarray(values).tobytes(),
        state=state,
        dtype=DType(table.spec.dtype).value,
        dim=table.spec.embedding_dim,
        state_width=width,
    ).SerializeToString()


def import_chunk(table: RemoteTable, chunk: RowChunk, node: Callable[[str], NodeCalls]) -> int:
    """Write one chunk to its owner shards (the router resends what a node refuses)."""

    def send(shard: int, positions: np.ndarray, epoch: int) -> int:
        message = part_message(table, chunk, positions, epoch)
        return node(table.endpoints[shard]).import_rows(message, table.name)

    keys = keys_to_numpy(chunk.keys)
    return sum(result.value for result in table.router.run(keys, send))
