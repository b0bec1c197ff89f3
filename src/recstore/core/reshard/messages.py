"""Resharding on the wire: the Migrat*/Seal*/SlotChecksums/SetSlotMap messages.

One place converts between ``ps.proto``'s reshard messages and the plain
arrays the node and the provisioners use, and builds the calls a provisioner
makes (``Rpc`` objects for ``ControlClient.call``), so the node, the local
provisioner and the operator share them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from recstore.core.control import Rpc
from recstore.core.proto_convert import slot_map_to_proto
from recstore.core.routing import SlotMap
from recstore.core.spec import DType
from recstore.v1 import ps_pb2

_NUMPY = {DType.float32: np.float32, DType.float16: np.float16, DType.bfloat16: np.uint16}
SOURCE = ps_pb2.MIGRATION_ROLE_SOURCE
TARGET = ps_pb2.MIGRATION_ROLE_TARGET

Ranges = Sequence[tuple[int, int]]
Role: TypeAlias = ps_pb2.MigrationRole


@dataclass(frozen=True)
class RowBatch:
    """Rows moving between nodes: resident rows with optimizer state, and deletions.

    ``present`` (a seal's tail) lists every resident key of the moving slots: the
    target drops any other key it imported there.
    """

    keys: np.ndarray  # int64[n]
    values: np.ndarray  # [n, dim], the table's dtype (bfloat16 as uint16)
    state: np.ndarray  # float32[n, state_width]
    gone: np.ndarray  # int64[]
    present: np.ndarray | None = None
    next_offset: int = 0
    dedup_entries: bytes = b""  # catch-up rounds, a tail: de-dup entries of the slots (encoded)
    dedup_entry_count: int = 0
    checksums: Checksums | None = None  # a seal's tail, when asked: the sealed slots'

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes + self.state.nbytes + self.gone.nbytes)


def rows_to_proto(rows: RowBatch, dtype: str) -> ps_pb2.MigrationRows:
    n, dim = rows.values.shape if rows.values.ndim == 2 else (0, 0)
    return ps_pb2.MigrationRows(
        keys=rows.keys.astype("<i8").tobytes(),
        values=np.ascontiguousarray(rows.values).tobytes(),
        state=rows.state.astype("<f4").tobytes(),
        rows=n,
        dtype=dtype,
        dim=dim,
        state_width=rows.state.shape[1] if rows.state.ndim == 2 else 0,
        gone_keys=rows.gone.astype("<i8").tobytes(),
        tail=rows.present is not None,
        present_keys=b"" if rows.present is None else rows.present.astype("<i8").tobytes(),
        next_offset=rows.next_offset,
        dedup_entries=rows.dedup_entries,
        dedup_entry_count=rows.dedup_entry_count,
        checksums=None if rows.checksums is None else checksums_to_proto(rows.checksums),
    )


def rows_from_proto(message: ps_pb2.MigrationRows, dtype: str, dim: int, width: int) -> RowBatch:
    """Decode, checking the sizes against the receiving table (ValueError when they differ)."""
    n = message.rows
    if message.rows and (
        message.dtype != dtype or message.dim != dim or message.state_width != width
    ):
        raise ValueError(
            f"rows of dtype {message.dtype} dim {message.dim} state {message.state_width} do not "
            f"fit a table of dtype {dtype} dim {dim} state {width}"
        )
    value_type = np.dtype(_NUMPY[DType(dtype)]).newbyteorder("<")
    if (
        len(message.keys) != 8 * n
        or len(message.values) != n * dim * value_type.itemsize
        or len(message.state) != 4 * n * width
        or len(message.gone_keys) % 8
        or len(message.present_keys) % 8
    ):
        raise ValueError(f"reshard rows: buffer lengths do not match {n} rows")
    return RowBatch(
        keys=np.frombuffer(message.keys, dtype="<i8").astype(np.int64),
        values=np.frombuffer(message.values, dtype=value_type).reshape(n, dim).copy(),
        state=np.frombuffer(message.state, dtype="<f4").reshape(n, width).astype(np.float32),
        gone=np.frombuffer(message.gone_keys, dtype="<i8").astype(np.int64),
        present=np.frombuffer(message.present_keys, dtype="<i8").astype(np.int64)
        if message.tail
        else None,
        next_offset=int(message.next_offset),
        dedup_entries=bytes(message.dedup_entries),
        dedup_entry_count=int(message.dedup_entry_count),
        checksums=checksums_in(message),
    )


def ranges_to_proto(ranges: Ranges, shard: int) -> list[ps_pb2.SlotRange]:
    return [ps_pb2.SlotRange(start=s, end=e, shard=shard) for s, e in ranges]


def ranges_from_proto(messages: Sequence[ps_pb2.SlotRange]) -> list[tuple[int, int]]:
    return [(int(r.start), int(r.end)) for r in messages]


@dataclass(frozen=True)
class Checksums:
    slots: np.ndarray  # int64
    rows: np.ndarray  # int64
    sums: np.ndarray  # uint64

    def differing(self, other: Checksums) -> list[int]:
        """Slots whose row count or checksum differ (both must cover the same slots)."""
        if not np.array_equal(self.slots, other.slots):
            raise ValueError("checksums of different slots cannot be compared")
        bad = (self.rows != other.rows) | (self.sums != other.sums)
        return [int(s) for s in self.slots[bad]]


def checksums_from_proto(message: ps_pb2.SlotChecksumsResponse) -> Checksums:
    return Checksums(
        np.frombuffer(message.slots, dtype="<i8").astype(np.int64),
        np.frombuffer(message.rows, dtype="<i8").astype(np.int64),
        np.frombuffer(message.checksums, dtype="<u8").astype(np.uint64),
    )


def checksums_to_proto(checksums: Checksums) -> ps_pb2.SlotChecksumsResponse:
    return ps_pb2.SlotChecksumsResponse(
        slots=checksums.slots.astype("<i8").tobytes(),
        rows=checksums.rows.astype("<i8").tobytes(),
        checksums=checksums.sums.astype("<u8").tobytes(),
    )


def checksums_in(
    reply: ps_pb2.MigrationRows | ps_pb2.MigrateImportResponse | ps_pb2.SetSlotMapResponse,
) -> Checksums | None:
    """The checksums a reply carries when they were asked for; None from a node that
    does not send them (the caller then asks with ``checksums_rpc``)."""
    return checksums_from_proto(reply.checksums) if reply.HasField("checksums") else None


# -- the calls a provisioner makes -------------------------------------------------
def begin_rpc(table: str, role: Role, ranges: Ranges, shard: int) -> Rpc[int]:
    request = ps_pb2.MigrateBeginRequest(
        table=table, role=role, slots=ranges_to_proto(ranges, shard)
    )
    return Rpc("MigrateBegin", request, lambda reply: int(reply.snapshot_rows))


def rows_rpc(
    table: str, *, changes: bool, offset: int = 0, max_rows: int = 0
) -> Rpc[ps_pb2.MigrationRows]:
    request = ps_pb2.MigrateRowsRequest(
        table=table, changes=changes, offset=offset, max_rows=max_rows
    )
    return Rpc("MigrateRows", request, lambda reply: reply)


def seal_rpc(
    table: str, timeout: float, *, with_checksums: bool = False
) -> Rpc[ps_pb2.MigrationRows]:
    request = ps_pb2.SealSlotsRequest(
        table=table, timeout_seconds=timeout, with_checksums=with_checksums
    )
    return Rpc("SealSlots", request, lambda reply: reply)


def import_rpc(table: str, rows: ps_pb2.MigrationRows) -> Rpc[int]:
    request = ps_pb2.MigrateImportRequest(table=table, rows=rows)
    return Rpc("MigrateImport", request, lambda reply: int(reply.rows))


def import_checked_rpc(table: str, rows: ps_pb2.MigrationRows) -> Rpc[Checksums | None]:
    """``import_rpc`` that also returns the importing slots' checksums after the rows."""
    request = ps_pb2.MigrateImportRequest(table=table, rows=rows, with_checksums=True)
    return Rpc("MigrateImport", request, checksums_in)


def abort_rpc(table: str, role: Role) -> Rpc[bool]:
    request = ps_pb2.MigrateAbortRequest(table=table, role=role)
    return Rpc("MigrateAbort", request, lambda reply: bool(reply.aborted))


def cleanup_rpc(table: str) -> Rpc[int]:
    request = ps_pb2.MigrateCleanupRequest(table=table)
    return Rpc("MigrateCleanup", request, lambda reply: int(reply.rows))


def checksums_rpc(table: str, ranges: Ranges) -> Rpc[Checksums]:
    request = ps_pb2.SlotChecksumsRequest(table=table, slots=ranges_to_proto(ranges, 0))
    return Rpc("SlotChecksums", request, checksums_from_proto)


def set_slot_map_rpc(table: str, expected_epoch: int, slot_map: SlotMap) -> Rpc[bool]:
    request = ps_pb2.SetSlotMapRequest(
        table=table, expected_epoch=expected_epoch, slot_map=slot_map_to_proto(slot_map)
    )
    return Rpc("SetSlotMap", request, lambda reply: bool(reply.changed))


def release_source_rpc(table: str, expected_epoch: int, slot_map: SlotMap) -> Rpc[float]:
    """``set_slot_map_rpc`` to a batch's source: how long it held writes to the moved
    slots (seal to refusal), in seconds."""
    request = ps_pb2.SetSlotMapRequest(
        table=table, expected_epoch=expected_epoch, slot_map=slot_map_to_proto(slot_map)
    )
    return Rpc("SetSlotMap", request, lambda reply: float(reply.held_seconds))


def activate_rpc(
    table: str, expected_epoch: int, slot_map: SlotMap, ranges: Ranges
) -> Rpc[Checksums | None]:
    """``set_slot_map_rpc`` to a target: also the checksums of ``ranges`` as they are when
    the map is installed (taken in the same hold of the table)."""
    request = ps_pb2.SetSlotMapRequest(
        table=table, expected_epoch=expected_epoch, slot_map=slot_map_to_proto(slot_map),
        checksum_slots=ranges_to_proto(ranges, 0),
    )  # fmt: skip
    return Rpc("SetSlotMap", request, checksums_in)
