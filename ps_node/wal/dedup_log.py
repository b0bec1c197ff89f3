"""De-dup window entries in the write-ahead log: the window survives a restart.

Two places hold them (``recstore.ps.wal.records`` frames both):

- a write's record names its request: flag ``FLAG_REQUEST`` in the record head,
  and after the keys and values one entry without slots (replay takes the
  slots from the record's keys);
- every segment opens with a window record (``OP_WINDOW``, after the magic)
  holding the table's whole window when the segment was started, so a replay
  from a checkpoint's generation also knows the ids applied before it.

Logs written before request ids have neither (the head's flags were reserved,
always 0) and replay as before. An entry: client length (u16), client (UTF-8),
seq (u64), digest (16 bytes), item count (u32) and rows per item (u64 each),
slot count (u32) and slots (u16 each); little-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

from recstore.core.request_id import DIGEST_BYTES, RequestId
from recstore.ps.wal.dedup import Entry

FLAG_REQUEST = 1  # the record ends with the entry of the request it belongs to
_CLIENT = struct.Struct("<H")
_SEQ = struct.Struct("<Q")
_COUNT = struct.Struct("<I")
_ROWS = np.dtype("<u8")
_SLOTS = np.dtype("<u2")


class EntryCorrupt(ValueError):
    """An entry that does not parse (the record's CRC passed: a writer's bug)."""


def encode_entry(entry: Entry, *, with_slots: bool = True) -> bytes:
    client = entry.request_id.client.encode()
    slots = entry.slots if with_slots else np.empty(0, np.uint16)
    return b"".join((
        _CLIENT.pack(len(client)), client, _SEQ.pack(entry.request_id.seq), entry.digest,
        _COUNT.pack(len(entry.rows)), np.asarray(entry.rows, _ROWS).tobytes(),
        _COUNT.pack(len(slots)), np.asarray(slots, _SLOTS).tobytes(),
    ))  # fmt: skip


def encode_entries(entries: Iterable[Entry]) -> tuple[int, bytes]:
    """(count, bytes) of a window record's body."""
    encoded = [encode_entry(e) for e in entries]
    return len(encoded), b"".join(encoded)


def decode_entries(data: bytes, offset: int, count: int) -> list[Entry]:
    """``count`` entries from ``offset``; they must end where ``data`` ends."""
    entries = []
    try:
        for _ in range(count):
            (size,) = _CLIENT.unpack_from(data, offset)
            offset += _CLIENT.size
            client = data[offset : offset + size].decode()
            offset += size
            (seq,) = _SEQ.unpack_from(data, offset)
            offset += _SEQ.size
            digest = data[offset : offset + DIGEST_BYTES]
            offset += DIGEST_BYTES
            (items,) = _COUNT.unpack_from(data, offset)
            offset += _COUNT.size
            rows = np.frombuffer(data, _ROWS, items, offset)
            offset += items * _ROWS.itemsize
            (slot_count,) = _COUNT.unpack_from(data, offset)
            offset += _COUNT.size
            slots = np.frombuffer(data, _SLOTS, slot_count, offset).astype(np.uint16)
            offset += slot_count * _SLOTS.itemsize
            if len(digest) != DIGEST_BYTES:
                raise EntryCorrupt("truncated digest")
            entries.append(
                Entry(RequestId(client, seq), digest, tuple(int(r) for r in rows), slots)
            )
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        raise EntryCorrupt(f"malformed de-dup entry in the log: {error}") from error
    if offset != len(data):
        raise EntryCorrupt(f"{len(data) - offset} bytes after the de-dup entries")
    return entries
