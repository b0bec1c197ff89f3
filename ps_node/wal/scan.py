"""The frames of a log segment, each checked on its own, and intact records past damage.

``frame_at`` checks one record's frame (it fits, its payload holds a head, its
CRC matches) and says whether a failure may be a torn write: incomplete, or
with a sector that reads as zeros, never written (etcd's rule).
``intact_after`` finds the intact records that lie past a damaged spot (a
record can only be a torn tail when none does); ``census`` counts those a
segment holds, whatever damage lies between them; ``record_starts`` gives its
layout. Records of every format (``recstore.ps.wal.records``) are read; the
segment-level checks are ``recstore.ps.wal.verify``'s.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from recstore.ps.wal.records import (
    DTYPE_NAMES,
    FRAME,
    FRAME_V1,
    HEAD,
    MAGIC_V1,
    OP_WINDOW,
    OPS,
    frame_crc,
    parse_header,
)

SECTOR = 512  # the unit a device writes whole or not at all (etcd's torn-write rule)
_SCAN_CHUNK = 1 << 22  # offsets tried at once when looking for an intact record


@dataclass(frozen=True)
class Bad:
    """A record that fails a check; ``torn``: it may be the incomplete last write."""

    problem: str
    torn: bool = False


@dataclass(frozen=True)
class Census:
    """Intact records found past damage: all of them, and those that are writes."""

    records: int = 0
    writes: int = 0


def intact_after(data: bytes, start: int, limit: int, version: int, min_index: int) -> Census:
    """The intact records in ``data[start:limit]``, damaged spots passed over."""
    records = writes = 0
    offset = start
    while (found := _next_intact(data, offset, limit, version, min_index)) is not None:
        offset = found[0]
        while (step := _intact_at(data, offset, limit, version)) is not None:
            offset, min_index = step[0], step[1] + 1
            records += 1
            writes += step[2] != OP_WINDOW
        offset += 1  # a damaged spot: look past it
    return Census(records, writes)


def census(data: bytes, start: int = 0) -> Census:
    """The intact records of a segment from ``start`` on (0: the whole segment), whatever
    damage lies between them."""
    version = 1 if data.startswith(MAGIC_V1) else 2
    if start == 0:
        header = parse_header(data)
        start = len(MAGIC_V1) if version == 1 else header.size if header is not None else 0
    return intact_after(data, start, len(data), version, 0)


def record_starts(data: bytes) -> list[int]:
    """Where each record of a segment (with a header) starts, in order, up to the first
    that fails a check or where nothing was written: a segment's layout, for tools."""
    header = parse_header(data)
    starts, offset = [], header.size if header is not None else len(data)
    while not isinstance(found := frame_at(data, offset, len(data), 2), Bad):
        starts.append(offset)
        offset = found.end
    return starts


@dataclass(frozen=True)
class Frame:
    end: int
    index: int  # 0 in a segment of the previous format
    payload: bytes


def frame_at(data: bytes, offset: int, limit: int, version: int) -> Frame | Bad:
    """The record at ``offset`` if its frame fits and its CRC matches; else what is wrong
    (``torn``: it may be the incomplete last write)."""
    frame = FRAME if version >= 2 else FRAME_V1
    if limit - offset < frame.size:
        return Bad(f"incomplete record frame ({limit - offset} bytes)", torn=True)
    length, crc = FRAME_V1.unpack_from(data, offset)  # both formats start so
    end = offset + frame.size + length
    if end > limit:
        return Bad(f"a record of {length} bytes runs past the end ({limit})", torn=True)
    if length < HEAD.size:
        problem = f"record length {length} is below a record head's {HEAD.size} bytes"
        return Bad(problem, torn=zeros(data, offset, limit))
    payload = data[offset + frame.size : end]
    index = FRAME.unpack_from(data, offset)[2] if version >= 2 else 0
    if (frame_crc(payload, index) if version >= 2 else zlib.crc32(payload)) != crc:
        last = end == limit or zeros(data, end, limit)  # nothing written after it
        return Bad("checksum mismatch", torn=last and _zero_sector(data, offset, end))
    return Frame(end, index, payload)


def _intact_at(data: bytes, offset: int, limit: int, version: int) -> tuple[int, int, int] | None:
    """(end, index, op) of an intact record at ``offset``, else None."""
    found = frame_at(data, offset, limit, version)
    return None if isinstance(found, Bad) else (found.end, found.index, found.payload[0])


def _next_intact(
    data: bytes, start: int, limit: int, version: int, min_index: int
) -> tuple[int, int] | None:
    """(offset, index) of the first intact record at or after ``start``.

    Offsets are screened a chunk at a time (a length that fits, a known op and
    dtype, an index not below ``min_index``); only those passing get a CRC.
    """
    frame = FRAME if version >= 2 else FRAME_V1
    view = memoryview(data)
    position = start
    while True:
        count = min(_SCAN_CHUNK, limit - frame.size - HEAD.size - position + 1)
        if count <= 0:
            return None
        lengths = np.ndarray((count,), "<u4", buffer=view, offset=position, strides=(1,))
        ops = np.ndarray((count,), "u1", buffer=view, offset=position + frame.size, strides=(1,))
        codes = np.ndarray((count,), "u1", buffer=view, offset=position + frame.size + 1,
                           strides=(1,))  # fmt: skip
        room = (limit - frame.size - position) - np.arange(count, dtype=np.int64)
        plausible = (lengths >= HEAD.size) & (lengths <= room)
        plausible &= np.isin(ops, list(OPS)) & (codes < len(DTYPE_NAMES))
        if version >= 2:
            indexes = np.ndarray((count,), "<u8", buffer=view, offset=position + 8, strides=(1,))
            plausible &= indexes >= min_index
        for candidate in np.flatnonzero(plausible):
            offset = position + int(candidate)
            found = _intact_at(data, offset, limit, version)
            if found is not None:
                return offset, found[1]
        position += count


def zeros(data: bytes, start: int, end: int) -> bool:
    """Whether ``data[start:end]`` is all zero bytes: space the file got, never written."""
    return end <= start or not np.frombuffer(data, np.uint8, end - start, start).any()


def _zero_sector(data: bytes, start: int, end: int) -> bool:
    """Whether a sector-aligned piece of ``data[start:end]`` is all zeros (never written)."""
    cuts = [start, *range((start // SECTOR + 1) * SECTOR, end, SECTOR)]
    pieces = np.frombuffer(data, np.uint8, end - start, start)
    return bool((np.maximum.reduceat(pieces, np.array(cuts) - start) == 0).any())
