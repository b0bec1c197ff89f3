"""The write-ahead log's record format: how one logged write is framed in a segment.

A segment starts with ``MAGIC`` and holds length-prefixed records with a CRC32
(``FRAME``); a record's payload is a ``HEAD`` (op, dtype, flags, rows, dim, lr)
and the request's raw buffers. Reading stops a segment at the first torn or
corrupt record: it was never acknowledged. The open log that appends these
records is ``recstore.ps.table_wal``; a table's segments on disk and their
replay are ``recstore.ps.wal_segments``.

A write record also says under which slot-map epoch the node applied it
(``FLAG_EPOCH``: the epoch follows the head), so a table's logs tell which node
wrote which slots at which epoch (``recstore.ps.apply_log``). Records of logs
written before that have the flag clear and replay as before.
"""

from __future__ import annotations

import logging
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from recstore.core.wire import Buffer
from recstore.ps.codec import KEY_DTYPE, WIRE_DTYPES
from recstore.ps.dedup import Entry
from recstore.ps.dedup_log import FLAG_REQUEST, decode_entries, encode_entries, encode_entry

log = logging.getLogger(__name__)

MAGIC = b"RSWAL001"
FRAME = struct.Struct("<II")  # payload length, crc32(payload)
HEAD = struct.Struct("<BBHIIf")  # op, dtype code, flags, rows, dim, lr (NaN: none)
OP_PUSH = 1
OP_UPDATE = 2
OP_IMPORT = 3  # rows with their optimizer state (ImportRows): float32 state after the values
OP_STEP = 4  # the table's optimizer step count set (ImportRows): one key holds it, no values
OP_WINDOW = 5  # the table's de-dup window (recstore.ps.dedup_log); rows: its entry count
FLAG_EPOCH = 2  # the head is followed by the slot-map epoch the write was applied under
EPOCH = struct.Struct("<Q")
OP_ERASE = 6  # rows removed (a move's cleanup, an aborted or trimmed import): keys, no values
#: records holding keys alone (no value rows)
KEYS_ONLY = frozenset({OP_STEP, OP_ERASE})
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
    """One framed record; ``keys``/``values``/``state`` are the request's raw buffers.

    ``epoch`` (the slot map's the write is applied under) follows the head; an
    import's state follows its values; a named write's request ends the record
    (imports are never named, so the two never meet)."""
    assert not (state and request), "an import record names no request"
    flags = (0 if request is None else FLAG_REQUEST) | (0 if epoch is None else FLAG_EPOCH)
    head = HEAD.pack(op, DTYPE_CODES[dtype], flags, rows, dim, math.nan if lr is None else lr)
    applied_under = b"" if epoch is None else EPOCH.pack(epoch)
    trailer = b"" if request is None else encode_entry(request, with_slots=False)
    return _framed(b"".join((head, applied_under, keys, values, state, trailer)))


def encode_window_record(entries: list[Entry]) -> bytes:
    """The record a segment opens with: the table's de-dup window."""
    count, body = encode_entries(entries)
    return _framed(HEAD.pack(OP_WINDOW, 0, 0, count, 0, math.nan) + body)


def _framed(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


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


def iter_records(data: bytes) -> Iterator[WalRecord]:
    """Records of one segment's bytes, stopping at a torn or corrupt record."""
    if not data.startswith(MAGIC):
        return
    offset = len(MAGIC)
    while offset + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, offset)
        start, end = offset + FRAME.size, offset + FRAME.size + length
        if end > len(data) or length < HEAD.size:
            log.warning("wal: torn record at offset %d ignored", offset)
            return
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            log.warning("wal: checksum mismatch at offset %d; rest of segment ignored", offset)
            return
        yield decode_payload(payload)
        offset = end
