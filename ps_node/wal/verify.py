"""One write-ahead log segment read with every check: what is a torn tail, what is damage.

Every record is checked: its frame fits, its payload holds at least a head, its
CRC matches, its index is the next one (records of the first format have no
index) and its payload decodes. A segment is created at the length its header
records, so a file shorter than that was cut, wherever the cut falls (inside a
record, at a record boundary, in the newest segment or any other): damage,
raised where the intact records before the cut end. Where a segment's records
end is also known for every segment but the newest: its successor's header
records it, and the records must end exactly there; bytes after that point are
a tail its writer cut off, or failed to cut off, and never acknowledged
(ignored). In the newest segment the records end where nothing was written
(zeros to the segment's end), or in a torn tail: a last record that is
incomplete (part of it reads as zeros, never written: etcd's rule; or, in a
segment of the previous format, it runs past the end of the file) with no
intact record after it. That tail is a write that was never acknowledged, and
recovery cuts it, saying so at info level. A segment whose creation never
finished (the log's ``newest`` marker does not name it yet) held nothing
acknowledged. Anything else is damage (``WalDamaged``): the segment, the
offset and what is wrong.

Segments of the previous format grew record by record: a truncation exactly at
a record boundary of the newest such segment cannot be told from a clean end.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

from recstore.core import RecStoreError
from recstore.ps.wal.records import (
    HEADER_SIZE,
    HEADER_SIZE_V2,
    MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    OPS,
    WalRecord,
    decode_payload,
    parse_header,
)
from recstore.ps.wal.scan import Bad, frame_at, intact_after, zeros

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

    ``data``: the segment's bytes, possibly without its unwritten rest (``size``: the
    file's size; what lies past ``data`` reads as zeros). ``recorded_end``: where its
    successor's header says its records end (None: nothing records it, so its tail
    may be torn). ``created``: whether the log's marker says its creation finished
    (None: the log has no marker, as logs of the first format).
    """

    def __init__(
        self,
        data: bytes,
        generation: int,
        *,
        recorded_end: int | None,
        size: int | None = None,
        created: bool | None = None,
    ) -> None:
        self.data, self.generation, self.recorded_end = data, generation, recorded_end
        self.size = len(data) if size is None else size
        self.created = created
        self.torn: int | None = None  # offset of the torn tail cut
        self.count = 0  # records read
        self.length: int | None = None  # the length its header records (format 3)
        self.version, self.start, self.predecessor_end = self._header()
        self.end = self.start  # where the records read so far end

    def damage(self, offset: int, problem: str) -> WalDamaged:
        return WalDamaged(self.generation, offset, problem)

    def _header(self) -> tuple[int, int, int | None]:
        """(format version, where records start, the predecessor's end it records)."""
        data = self.data
        if self.recorded_end == 0:  # its successor records that it holds nothing
            return 3, 0, None
        if self.recorded_end is None and self.created is False:
            self._cut(0, "the segment was being created: the log's marker names an older one")
            return 3, 0, None
        if data.startswith(MAGIC_V1):
            return 1, len(MAGIC_V1), None
        parsed = parse_header(data)
        if parsed is not None:
            if parsed.generation != self.generation:
                raise self.damage(
                    len(MAGIC),
                    f"its header says generation {parsed.generation}: the segment is out of "
                    "order (renamed or copied)",
                )
            self.length = parsed.length
            return parsed.version, parsed.size, parsed.predecessor_end
        if self.recorded_end is None and self.created is None and self._creation_torn():
            self._cut(0, "its header was being written")
            return 3, 0, None
        if not data.startswith((MAGIC, MAGIC_V2)):
            raise self.damage(0, f"bad segment magic {data[: len(MAGIC)]!r}")
        if len(data) < HEADER_SIZE_V2 or (data.startswith(MAGIC) and len(data) < HEADER_SIZE):
            raise self.damage(0, f"segment header cut off ({len(data)} bytes)")
        raise self.damage(0, "segment header checksum mismatch")

    def _creation_torn(self) -> bool:
        """The node died creating the segment: what is there is a prefix of its header."""
        data = self.data
        if len(data) >= HEADER_SIZE_V2 and data[:HEADER_SIZE].strip(b"\0"):
            return False
        written = data[:HEADER_SIZE].rstrip(b"\0")
        expected = [magic + _GENERATION.pack(self.generation) for magic in (MAGIC, MAGIC_V2)]
        return any(e.startswith(written[: len(e)]) for e in expected) or MAGIC_V1.startswith(
            written
        )

    def __iter__(self) -> Iterator[WalRecord]:
        if self.torn is not None or self.recorded_end == 0:
            return
        data, recorded = self.data, self.recorded_end
        if recorded is not None and recorded < self.start:
            raise self.damage(
                self.start, f"its successor records that its records end at byte {recorded}"
            )
        limit = len(data) if recorded is None else min(recorded, len(data))
        if recorded is not None and not zeros(data, recorded, len(data)):
            log.info(
                "wal: segment %s: bytes after offset %d, cut off by its writer and never "
                "acknowledged, ignored", segment_name(self.generation), recorded,
            )  # fmt: skip
        offset = self.start
        while offset < limit:
            if self.length is not None and recorded is None and zeros(data, offset, len(data)):
                break  # nothing written from here on: where the records end
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
                f"truncated: the segment is {self.size} bytes, but its successor records that "
                f"its records end at byte {recorded}",
            )
        if self._cut_short():
            raise self.damage(self.end, self._short())

    def _cut_short(self) -> bool:
        return self.length is not None and self.size != self.length

    def _short(self) -> str:
        return f"truncated: the segment is {self.size} bytes, but its header records {self.length}"

    def _record_at(self, offset: int, limit: int) -> tuple[int, WalRecord] | Bad:
        found = frame_at(self.data, offset, limit, self.version)
        if isinstance(found, Bad):
            return found
        if self.version >= 2 and found.index != self.count:
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
        if recorded is not None and self.size < recorded:
            raise self.damage(
                offset,
                f"truncated: the segment is {self.size} bytes, but its successor records "
                f"that its records end at byte {recorded} ({bad.problem})",
            )
        if self._cut_short():
            raise self.damage(offset, f"{self._short()} ({bad.problem})")
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
            "wal: segment %s: torn tail at offset %d (a write never acknowledged: %s) cut",
            segment_name(self.generation), offset, why,
        )  # fmt: skip


def read_through(reader: SegmentReader) -> SegmentReader:
    """Check every record of ``reader`` (raising ``WalDamaged``); returns it, read."""
    for _ in reader:
        pass
    return reader
