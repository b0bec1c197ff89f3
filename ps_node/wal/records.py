"""The write-ahead log's format: how a segment and one logged write in it are framed.

A segment opens with ``MAGIC`` and a ``SEGMENT`` header (its generation, where
its predecessor's records end, the segment's length, a CRC32 of them), then
holds records: a ``FRAME`` (payload length, CRC32, the record's index in its
segment: 0, 1, ...) and the payload, a ``HEAD`` (op, dtype, flags, rows, dim,
lr) and the request's raw buffers. The CRC covers the length, the index and the
payload, so a record that is damaged, missing, repeated or out of order fails
it. A segment is created at its full length (``SEGMENT_BYTES`` unless a record
needs more, as etcd preallocates its 64 MB segments; a sparse file until
written), so a file cut short of the length its header records is a
truncation, wherever the cut falls; what was never written reads as zeros.
Segments of the previous formats are still read: ``MAGIC_V2`` (a header
without a length, grown record by record) and ``MAGIC_V1`` (no header,
``FRAME_V1`` without an index). Reading a segment and every check on it is
``recstore.ps.wal.verify``; the open log that appends records is
``recstore.ps.wal.table_log``; a table's segments on disk and their replay are
``recstore.ps.wal.segments``.

A write record also says under which slot-map epoch the node applied it
(``FLAG_EPOCH``: the epoch follows the head), so a table's logs tell which node
wrote which slots at which epoch (``recstore.ps.wal.apply_log``). Records of logs
written before that have the flag clear and replay as before.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from recstore.core.wire import Buffer
from recstore.ps.codec import KEY_DTYPE, WIRE_DTYPES
from recstore.ps.wal.dedup import Entry
from recstore.ps.wal.dedup_log import FLAG_REQUEST, decode_entries, encode_entries, encode_entry

MAGIC = b"RSWAL003"
#: generation, where the predecessor's records end (``NO_PREDECESSOR``), the segment's
#: length in bytes, crc32 of the magic and the three
SEGMENT = struct.Struct("<QQQI")
HEADER_SIZE = len(MAGIC) + SEGMENT.size
SEGMENT_BYTES = 64 << 20  # a segment's length unless its first records need more
NO_PREDECESSOR = 2**64 - 1  # the log had no segment before this one
MAGIC_V2 = b"RSWAL002"  # the previous format: a header without a length
SEGMENT_V2 = struct.Struct("<QQI")  # generation, predecessor end, crc32(magic + both)
HEADER_SIZE_V2 = len(MAGIC_V2) + SEGMENT_V2.size
FRAME = struct.Struct("<IIQ")  # payload length, crc32(length, index, payload), index
_FRAME_FIELDS = struct.Struct("<IQ")  # what the CRC covers before the payload
MAGIC_V1 = b"RSWAL001"  # the previous format: no header, records framed by FRAME_V1
FRAME_V1 = struct.Struct("<II")  # payload length, crc32(payload)
HEAD = struct.Struct("<BBHIIf")  # op, dtype code, flags, rows, dim, lr (NaN: none)
OP_PUSH = 1
OP_UPDATE = 2
OP_IMPORT = 3  # rows with their optimizer state (ImportRows): float32 state after the values
OP_STEP = 4  # the table's optimizer step count set (ImportRows): one key holds it, no values
OP_WINDOW = 5  # the table's de-dup window (recstore.ps.wal.dedup_log); rows: its entry count
FLAG_EPOCH = 2  # the head is followed by the slot-map epoch the write was applied under
EPOCH = struct.Struct("<Q")
OP_ERASE = 6  # rows removed (a move's cleanup, an aborted or trimmed import): keys, no values
#: records holding keys alone (no value rows)
KEYS_ONLY = frozenset({OP_STEP, OP_ERASE})
OPS = frozenset({OP_PUSH, OP_UPDATE, OP_IMPORT, OP_STEP, OP_WINDOW, OP_ERASE})
DTYPE_CODES = {name: code for code, name in enumerate(WIRE_DTYPES)}
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}


@dataclass(frozen=True)
class WalRecord:
    op: int
    keys: np.ndarray  # int64[rows]
    values: np.ndarray  # [rows, dim] of dtype (values for push, grads for update)
    dtype: str
    lr: float | None
    state: np.ndarray | None = None  # float32[rows, width] of an import
    request: Entry | None = None  # the request it belongs to (slots not filled in)
    window: tuple[Entry, ...] = ()  # an OP_WINDOW record's entries
    epoch: int | None = None  # the slot-map epoch it was applied under (None: not logged)


def encode_record(
    op: int,
    keys: Buffer,
    values: Buffer,
    dtype: str,
    rows: int,
    dim: int,
    lr: float | None,
    state: Buffer = b"",
    request: Entry | None = None,
    epoch: int | None = None,
) -> bytes:
    """One record's payload (``TableWal.append`` frames it); ``keys``/``values``/``state``
    are the request's raw buffers.

    ``epoch`` (the slot map's the write is applied under) follows the head; an
    import's state follows its values; a named write's request ends the record
    (imports are never named, so the two never meet)."""
    assert not (state and request), "an import record names no request"
    flags = (0 if request is None else FLAG_REQUEST) | (0 if epoch is None else FLAG_EPOCH)
    head = HEAD.pack(op, DTYPE_CODES[dtype], flags, rows, dim, math.nan if lr is None else lr)
    applied_under = b"" if epoch is None else EPOCH.pack(epoch)
    trailer = b"" if request is None else encode_entry(request, with_slots=False)
    return b"".join((head, applied_under, keys, values, state, trailer))


def encode_window_record(entries: list[Entry]) -> bytes:
    """The payload of the record a segment opens with: the table's de-dup window."""
    count, body = encode_entries(entries)
    return HEAD.pack(OP_WINDOW, 0, 0, count, 0, math.nan) + body


def frame_crc(payload: bytes | memoryview, index: int) -> int:
    return zlib.crc32(payload, zlib.crc32(_FRAME_FIELDS.pack(len(payload), index)))


def frame(payload: bytes, index: int) -> bytes:
    """The record ``payload`` as the ``index``-th of its segment."""
    return FRAME.pack(len(payload), frame_crc(payload, index), index) + payload


@dataclass(frozen=True)
class SegmentHeader:
    """A segment's verified header."""

    version: int  # 3, or 2: the previous format
    generation: int
    predecessor_end: int  # ``NO_PREDECESSOR``: the log had no segment before it
    length: int | None  # the file's size, fixed at creation (None: format 2, grown)
    size: int  # the header's bytes: where records start


def segment_header(generation: int, predecessor_end: int, length: int) -> bytes:
    """What a segment of ``length`` bytes starts with; ``predecessor_end``: the size of
    the previous segment that holds its records (``NO_PREDECESSOR`` when there is none)."""
    fields = MAGIC + SEGMENT.pack(generation, predecessor_end, length, 0)[:-4]
    return fields + struct.pack("<I", zlib.crc32(fields))


def parse_header(data: bytes) -> SegmentHeader | None:
    """The header ``data`` starts with, of this format or the previous; None when it
    does not verify."""
    if data.startswith(MAGIC) and len(data) >= HEADER_SIZE:
        generation, predecessor_end, length, crc = SEGMENT.unpack_from(data, len(MAGIC))
        if zlib.crc32(data[: HEADER_SIZE - 4]) == crc:
            return SegmentHeader(3, generation, predecessor_end, length, HEADER_SIZE)
    elif data.startswith(MAGIC_V2) and len(data) >= HEADER_SIZE_V2:
        generation, predecessor_end, crc = SEGMENT_V2.unpack_from(data, len(MAGIC_V2))
        if zlib.crc32(data[: HEADER_SIZE_V2 - 4]) == crc:
            return SegmentHeader(2, generation, predecessor_end, None, HEADER_SIZE_V2)
    return None


def decode_payload(payload: bytes) -> WalRecord:
    op, code, flags, rows, dim, lr = HEAD.unpack_from(payload)
    dtype = DTYPE_NAMES[code]
    if op == OP_WINDOW:
        window = tuple(decode_entries(payload, HEAD.size, rows))
        return WalRecord(op, np.empty(0, KEY_DTYPE), np.empty((0, 0)), dtype, None, window=window)
    epoch = EPOCH.unpack_from(payload, HEAD.size)[0] if flags & FLAG_EPOCH else None
    keys_start = HEAD.size + (EPOCH.size if epoch is not None else 0)
    keys_end = keys_start + rows * KEY_DTYPE.itemsize
    keys = np.frombuffer(payload, KEY_DTYPE, rows, keys_start)
    values = np.frombuffer(payload, WIRE_DTYPES[dtype], rows * dim, keys_end).reshape(rows, dim)
    values_end = keys_end + values.nbytes
    state = request = None
    if op == OP_IMPORT:  # what follows the values is the rows' optimizer state
        width = (len(payload) - values_end) // (4 * rows) if rows else 0
        state = np.frombuffer(payload, np.float32, rows * width, values_end).reshape(rows, width)
    elif flags & FLAG_REQUEST:
        (request,) = decode_entries(payload, values_end, 1)
    lr_or_none = None if math.isnan(lr) else float(lr)
    return WalRecord(op, keys, values, dtype, lr_or_none, state, request, epoch=epoch)
