"""One write-ahead log segment read with every check: what is a torn tail, what is damage.

Every record is checked: its frame fits, its payload holds at least a head, its
CRC matches, its index is the next one (records of the previous format have no
index) and its payload decodes. Where a segment's records end is known for every
segment but the newest: its successor's header records it, and the records must
end exactly there; bytes after that point are a tail its writer cut off, or
failed to cut off, and never acknowledged (ignored). Only where nothing records
the end (the newest segment, or one followed by a segment of the previous
format) may the records end in a torn tail: a last record that is incomplete
(it runs past the end of the file, or part of it reads as zeros, never written:
etcd's rule) with no intact record after it. That tail is a write that was never
acknowledged, and recovery cuts it, saying so at info level. Anything else is
damage (``WalDamaged``): the segment, the offset and what is wrong.

A truncation exactly at a record boundary of the newest segment cannot be told
from a clean end (etcd states the same limit); every other segment's end is
recorded by its successor.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

from recstore.core import RecStoreError
from recstore.ps.wal.records import (
    HEADER_SIZE,
    MAGIC,
    MAGIC_V1,
    OPS,
    WalRecord,
    decode_payload,
    parse_header,
)
from recstore.ps.wal.scan import Bad, frame_at, intact_after

log = logging.getLogger(__name__)

_GENERATION = struct.Struct("<Q")


def segment_name(generation: int) -> str:
    return f"{generation:012d}.wal"


class WalDamaged(RecStoreError):
    """A log segment that fails a check: where (segment, offset) and what is wrong."""

    def __init__(self, generation: int, offset: int, problem: str) -> None:
        super().__init__(f"segment {segment_name(generation)}, offset {offset}: {problem}")
        self.generation, self.offset, self.problem = generation, offset, problem


class SegmentReader:
    """The checked records of one segment's bytes; ``end`` and ``torn`` once read.

    ``recorded_end``: where its successor's header says its records end (None:
    nothing records it, so its tail may be torn).
    """

    def __init__(self, data: bytes, generation: int, *, recorded_end: int | None) -> None:
        self.data, self.generation, self.recorded_end = data, generation, recorded_end
        self.torn: int | None = None  # offset of the torn tail cut
        self.count = 0  # records read
        self.version, self.start, self.predecessor_end = self._header()
        self.end = self.start  # where the records read so far end

    def damage(self, offset: int, problem: str) -> WalDamaged:
        return WalDamaged(self.generation, offset, problem)

    def _header(self) -> tuple[int, int, int | None]:
        """(format version, where records start, the predecessor's end it records)."""
        data = self.data
        if self.recorded_end == 0:  # its successor records that it holds nothing
            return 2, 0, None
        if data.startswith(MAGIC_V1):
            return 1, len(MAGIC_V1), None
        parsed = parse_header(data)
        if parsed is not None:
            generation, predecessor_end = parsed
            if generation != self.generation:
                raise self.damage(
                    len(MAGIC),
                    f"its header says generation {generation}: the segment is out of order "
                    "(renamed or copied)",
                )
            return 2, HEADER_SIZE, predecessor_end
        if self.recorded_end is None and self._creation_torn():
            self._cut(0, "its header was being written")
            return 2, 0, None
        if not data.startswith(MAGIC):
            raise self.damage(0, f"bad segment magic {data[: len(MAGIC)]!r}")
        if len(data) < HEADER_SIZE:
            raise self.damage(0, f"segment header cut off ({len(data)} bytes)")
        raise self.damage(0, "segment header checksum mismatch")

    def _creation_torn(self) -> bool:
        """The node died creating the segment: what is there is a prefix of its header."""
        data = self.data
        if len(data) >= HEADER_SIZE:
            return False
        expected = MAGIC + _GENERATION.pack(self.generation)
        return expected.startswith(data[: len(expected)]) or MAGIC_V1.startswith(data)

    def __iter__(self) -> Iterator[WalRecord]:
        if self.torn is not None or self.recorded_end == 0:
            return
        data, recorded = self.data, self.recorded_end
        if recorded is not None and recorded < self.start:
            raise self.damage(
                self.start, f"its successor records that its records end at byte {recorded}"
            )
        limit = len(data) if recorded is None else min(recorded, len(data))
        if recorded is not None and len(data) > recorded:
            log.info(
                "wal: segment %s: %d bytes after offset %d, cut off by its writer and never "
                "acknowledged, ignored", segment_name(self.generation), len(data) - recorded,
                recorded,
            )  # fmt: skip
        offset = self.start
        while offset < limit:
            found = self._record_at(offset, limit)
            if isinstance(found, Bad):
                self._stop(offset, limit, found)
                return
            end, record = found
            self.count += 1
            self.end = offset = end
            yield record
        if recorded is not None and self.end < recorded:
            raise self.damage(
                self.end,
                f"truncated: the segment is {len(data)} bytes, but its successor records that "
                f"its records end at byte {recorded}",
            )

    def _record_at(self, offset: int, limit: int) -> tuple[int, WalRecord] | Bad:
        found = frame_at(self.data, offset, limit, self.version)
        if isinstance(found, Bad):
            return found
        if self.version == 2 and found.index != self.count:
            return Bad(f"record index {found.index} where {self.count} was expected (out of order)")
        try:
            record = decode_payload(found.payload)
            if record.op not in OPS:
                raise ValueError(f"unknown op {record.op}")
        except (ValueError, KeyError, struct.error) as error:
            return Bad(f"the record does not decode: {error}")
        return found.end, record

    def _stop(self, offset: int, limit: int, bad: Bad) -> None:
        """Cut a torn tail, or raise: the record at ``offset`` failed its checks."""
        recorded = self.recorded_end
        if recorded is not None and len(self.data) < recorded:
            raise self.damage(
                offset,
                f"truncated: the segment is {len(self.data)} bytes, but its successor records "
                f"that its records end at byte {recorded} ({bad.problem})",
            )
        after = intact_after(self.data, offset + 1, limit, self.version, self.count + 1).records
        if bad.torn and recorded is None and after == 0:
            self._cut(offset, bad.problem)
            return
        problem = bad.problem
        if recorded is not None and bad.torn:
            problem += f", but its successor records that its records end at byte {recorded}"
        if after:
            problem += f"; {after} intact records follow it"
        raise self.damage(offset, problem)

    def _cut(self, offset: int, why: str) -> None:
        self.torn = offset
        log.info(
            "wal: segment %s: torn tail at offset %d (%d bytes of a write never acknowledged: "
            "%s) cut", segment_name(self.generation), offset, len(self.data) - offset, why,
        )  # fmt: skip


def read_through(reader: SegmentReader) -> SegmentReader:
    """Check every record of ``reader`` (raising ``WalDamaged``); returns it, read."""
    for _ in reader:
        pass
    return reader
