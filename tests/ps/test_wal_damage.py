"""A damaged write-ahead log is refused at the spot, never replayed as if it ended there.

Logs written by ``TableWal`` (segments rotated as a checkpoint rotates them),
then damaged on disk the ways a disk, an operator or an attacker does: every
record is checked, only a torn tail of the newest segment is cut, and an
operator's accepted loss cuts the log back to its intact prefix.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from recstore.ps.serve.server import start_in_thread
from recstore.ps.wal import records as wal
from recstore.ps.wal import repair as wal_repair
from recstore.ps.wal import segments as wal_segments
from recstore.ps.wal.records import OP_PUSH, WalRecord
from recstore.ps.wal.table_log import TableWal
from recstore.ps.wal.verify import WalDamaged

from .conftest import Client

DIM = 4


def payload(key: int, dim: int = DIM) -> bytes:
    values = np.full((1, dim), float(key), "<f4")
    return wal.encode_record(
        OP_PUSH, np.array([key], "<i8").tobytes(), values.tobytes(), "float32", 1, dim, None
    )


RECORD = wal.FRAME.size + len(payload(0))
SEGMENT = 4096  # the segments' length here: small files to damage, the real format


def at(index: int) -> int:
    """Offset of a segment's ``index``-th record (all the same size here)."""
    return wal.HEADER_SIZE + RECORD * index


def log_of(directory: Path, *counts: int) -> list[int]:
    """A closed log whose segments hold ``counts`` records; the keys, in order."""
    log = TableWal(directory, segment_bytes=SEGMENT)
    keys: list[int] = []
    for number, count in enumerate(counts):
        if number:
            log.rotate()
        for _ in range(count):
            log.append(payload(len(keys)))
            keys.append(len(keys))
    log.wait_durable()
    log.close()
    return keys


def keys_of(directory: Path, start: int = 0) -> list[int]:
    out: list[WalRecord] = []
    wal_segments.replay(directory, start, out.append)
    return [int(r.keys[0]) for r in out]


def segment(directory: Path, generation: int) -> Path:
    return wal_segments.segment_path(directory, generation)


def flip(path: Path, offset: int, mask: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def refused(directory: Path, generation: int, offset: int, start: int = 0) -> str:
    """Replay must fail at (generation, offset); returns what it said."""
    with pytest.raises(WalDamaged) as damaged:
        keys_of(directory, start)
    assert (damaged.value.generation, damaged.value.offset) == (generation, offset), damaged.value
    assert str(damaged.value).startswith(f"segment {generation:012d}.wal, offset {offset}: ")
    return damaged.value.problem


# -- a record damaged with intact records after it -------------------------------------
@pytest.mark.parametrize(("where", "byte"), [("length", 1), ("crc", 4), ("index", 8),
                                              ("payload", 30)])  # fmt: skip
@pytest.mark.parametrize("generation", [1, 2])  # a middle segment, the newest
def test_one_bit_flipped_in_a_record_with_records_after_it_is_refused(
    tmp_path: Path, where: str, byte: int, generation: int
) -> None:
    log_of(tmp_path, 10, 10, 10)
    flip(segment(tmp_path, generation), at(4) + byte, 0x40)
    problem = refused(tmp_path, generation, at(4))
    assert problem.endswith("; 5 intact records follow it"), problem


def test_records_swapped_in_a_segment_are_out_of_order(tmp_path: Path) -> None:
    log_of(tmp_path, 10)
    path = segment(tmp_path, 0)
    data = bytearray(path.read_bytes())
    third, fourth = data[at(3) : at(4)], data[at(4) : at(5)]
    data[at(3) : at(5)] = fourth + third  # each intact on its own
    path.write_bytes(bytes(data))
    assert refused(tmp_path, 0, at(3)).startswith("record index 4 where 3 was expected")


def test_a_record_removed_from_the_middle_is_refused(tmp_path: Path) -> None:
    log_of(tmp_path, 10)
    path = segment(tmp_path, 0)
    data = path.read_bytes()
    path.write_bytes(data[: at(3)] + data[at(4) :] + bytes(RECORD))  # the length it had
    assert refused(tmp_path, 0, at(3)).startswith("record index 4 where 3 was expected")


# -- segment headers ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("offset", "problem"),
    [(0, "bad segment magic b'QSWAL003'"), (9, "segment header checksum mismatch")],
)
@pytest.mark.parametrize("generation", [0, 1, 2])
def test_a_damaged_segment_header_is_refused(
    tmp_path: Path, offset: int, problem: str, generation: int
) -> None:
    log_of(tmp_path, 3, 3, 3)
    flip(segment(tmp_path, generation), offset, 0x03 if offset == 0 else 0x01)
    assert refused(tmp_path, generation, 0) == problem


def test_segments_swapped_are_out_of_order(tmp_path: Path) -> None:
    log_of(tmp_path, 3, 3, 3)
    first, second = segment(tmp_path, 1), segment(tmp_path, 2)
    first_bytes = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(first_bytes)
    problem = refused(tmp_path, 1, len(wal.MAGIC))
    assert (
        problem == "its header says generation 2: the segment is out of order (renamed or copied)"
    )


# -- truncations -------------------------------------------------------------------------
@pytest.mark.parametrize("into", [0, 1, 20])  # at a record boundary, into its frame, its payload
def test_a_middle_segment_cut_short_is_refused(tmp_path: Path, into: int) -> None:
    log_of(tmp_path, 10, 10, 10)
    os.truncate(segment(tmp_path, 1), at(4) + into)
    problem = refused(tmp_path, 1, at(4))
    assert problem.startswith(
        f"truncated: the segment is {at(4) + into} bytes, but its successor records that its "
        f"records end at byte {at(10)}"
    )


def overwrite(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` into the file at ``offset``, its length unchanged."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def test_a_torn_last_record_of_the_newest_segment_is_cut_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = log_of(tmp_path, 10, 18)  # the last record, at(17), runs across byte 1024
    assert at(17) < 1024 < at(18)
    # the last write was never acknowledged: a device writes whole sectors, and the last of
    # its sectors never reached the disk
    path = segment(tmp_path, 1)
    written = path.read_bytes()[1024 : at(18)]
    overwrite(path, 1024, bytes(at(18) - 1024))
    with caplog.at_level(logging.INFO, logger="recstore.ps.wal.verify"):
        assert keys_of(tmp_path) == keys[:-1]
    (said,) = [r for r in caplog.records if "torn tail" in r.getMessage()]
    assert said.levelno == logging.INFO
    assert f"segment 000000000001.wal: torn tail at offset {at(17)}" in said.getMessage()
    # part of a sector written, the rest of it zeros: not what a device does, damage
    overwrite(path, 1024, written[:12])
    assert refused(tmp_path, 1, at(17)) == "checksum mismatch"


NEWEST_CUTS = {  # where the newest segment is cut, and where the replay must stop
    "inside its last record": (at(9) + 30, at(9)),
    "inside its frame": (at(9) + 5, at(9)),
    "at a record boundary": (at(9), at(9)),
    "after its last record": (at(10) + 100, at(10)),
    "inside an earlier record": (at(4) + 20, at(4)),
}


@pytest.mark.parametrize("where", NEWEST_CUTS)
def test_the_newest_segment_cut_anywhere_is_refused(tmp_path: Path, where: str) -> None:
    """A segment is created at its full length: a cut is never taken for a clean end."""
    keys = log_of(tmp_path, 10, 10)
    size, stop = NEWEST_CUTS[where]
    os.truncate(segment(tmp_path, 1), size)
    problem = refused(tmp_path, 1, stop)
    assert problem.startswith(
        f"truncated: the segment is {size} bytes, but its header records {SEGMENT}"
    )
    prefix: list[WalRecord] = []  # what the operator may accept: every record before the cut
    wal_segments.replay(tmp_path, 0, prefix.append, stop_at_damage=True)
    assert [int(r.keys[0]) for r in prefix] == keys[: 10 + (stop - at(0)) // RECORD]


def test_the_newest_segment_cut_into_its_header_is_refused(tmp_path: Path) -> None:
    log_of(tmp_path, 5, 5)
    os.truncate(segment(tmp_path, 1), 12)  # the log's marker says it was created whole
    assert refused(tmp_path, 1, 0) == "segment header cut off (12 bytes)"


def test_a_full_segment_is_followed_by_a_fresh_one(tmp_path: Path) -> None:
    per_segment = (SEGMENT - wal.HEADER_SIZE) // RECORD
    keys = log_of(tmp_path, 2 * per_segment + 3)  # no rotation asked for
    assert wal_segments.generations(tmp_path) == [0, 1, 2]
    assert keys_of(tmp_path) == keys
    log = TableWal(tmp_path, segment_bytes=SEGMENT)
    big = payload(7, dim=2000)  # more than a segment holds: a segment of its own length
    log.append(big)
    log.append(payload(8))
    log.wait_durable()
    log.close()
    assert wal_segments.generations(tmp_path) == [0, 1, 2, 3, 4, 5]
    sizes = [segment(tmp_path, g).stat().st_size for g in (3, 4, 5)]
    assert sizes == [SEGMENT, wal.HEADER_SIZE + wal.FRAME.size + len(big), SEGMENT]
    assert keys_of(tmp_path) == [*keys, 7, 8]
    # each full segment's end is recorded by its successor: a cut in one is refused
    os.truncate(segment(tmp_path, 0), at(per_segment - 1))
    assert refused(tmp_path, 0, at(per_segment - 1)).startswith(
        f"truncated: the segment is {at(per_segment - 1)} bytes, but its successor records "
        f"that its records end at byte {at(per_segment)}"
    )


def test_a_last_record_with_a_sector_never_written_is_a_torn_tail(tmp_path: Path) -> None:
    log = TableWal(tmp_path, segment_bytes=3 * SEGMENT)
    log.append(payload(0))
    log.append(payload(1, dim=1024))  # spans sectors
    log.wait_durable()
    log.close()
    path = segment(tmp_path, 0)
    overwrite(path, 1024, bytes(512))  # a whole sector of it lost
    assert keys_of(tmp_path) == [0]
    overwrite(path, 1024, b"\x01" * 512)  # garbage is not an unwritten sector: damage
    assert refused(tmp_path, 0, at(1)) == "checksum mismatch"


def test_what_follows_a_segments_recorded_end_was_never_acknowledged(tmp_path: Path) -> None:
    """A failed cut-back leaves bytes after what the successor records: ignored."""
    keys = log_of(tmp_path, 5, 5)
    overwrite(segment(tmp_path, 0), at(5), wal.frame(payload(99), 5)[:30])
    assert keys_of(tmp_path) == keys


def test_a_segment_whose_creation_never_finished_holds_nothing(tmp_path: Path) -> None:
    keys = log_of(tmp_path, 5)
    # the node died creating segment 1, before the log's marker named it
    segment(tmp_path, 1).write_bytes(wal.segment_header(1, at(5), SEGMENT)[:12])
    assert keys_of(tmp_path) == keys
    reopened = TableWal(tmp_path)  # a restart: its successor records that it held nothing
    reopened.append(payload(5))
    reopened.wait_durable()
    reopened.close()
    assert keys_of(tmp_path) == [*keys, 5]


# -- missing segments --------------------------------------------------------------------
def test_a_segment_missing_between_others_is_refused(tmp_path: Path) -> None:
    log_of(tmp_path, 3, 3, 3, 3)
    segment(tmp_path, 2).unlink()
    problem = refused(tmp_path, 2, 0)
    assert problem == "the segment is missing (segments present from there: 0..1, 3; the log's "\
        "marker says segment 3 was created)"  # fmt: skip


def test_the_newest_segment_missing_is_refused(tmp_path: Path) -> None:
    keys = log_of(tmp_path, 3, 3, 3)
    segment(tmp_path, 2).unlink()
    problem = refused(tmp_path, 2, 0)
    assert problem.endswith("the log's marker says segment 2 was created)")
    # the limit: with its marker gone too, nothing says the log went further
    (tmp_path / wal_segments.NEWEST).unlink()
    assert keys_of(tmp_path) == keys[:6]


# -- the previous format -----------------------------------------------------------------
def v1_segment(keys: list[int], torn: int = 0) -> bytes:
    """A segment as the previous release wrote it (no header, no record index)."""
    out = wal.MAGIC_V1
    for key in keys:
        values = np.full((1, DIM), float(key), "<f4")
        head = wal.HEAD.pack(OP_PUSH, wal.DTYPE_CODES["float32"], 0, 1, DIM, math.nan)
        body = head + np.array([key], "<i8").tobytes() + values.tobytes()
        out += wal.FRAME_V1.pack(len(body), zlib.crc32(body)) + body
    return out[: len(out) - torn]


def test_a_log_of_the_previous_format_replays_and_is_continued(tmp_path: Path) -> None:
    # segment 0 ends in a torn record, as a node of that release left it at a restart
    segment(tmp_path, 0).write_bytes(v1_segment([0, 1, 2], torn=7))
    segment(tmp_path, 1).write_bytes(v1_segment([3, 4]))
    assert keys_of(tmp_path) == [0, 1, 3, 4]
    log = TableWal(tmp_path)  # this release continues it on a segment of its own format
    log.append(payload(5))
    log.wait_durable()
    log.close()
    assert keys_of(tmp_path) == [0, 1, 3, 4, 5]
    data = bytearray(segment(tmp_path, 1).read_bytes())
    data[len(wal.MAGIC_V1) + 20] ^= 0x01  # damage in its first record: one intact after it
    segment(tmp_path, 1).write_bytes(bytes(data))
    assert (
        refused(tmp_path, 1, len(wal.MAGIC_V1)) == "checksum mismatch; 1 intact records follow it"
    )


# -- an accepted loss --------------------------------------------------------------------
def test_an_accepted_loss_cuts_the_log_back_to_its_intact_prefix(tmp_path: Path) -> None:
    log_dir, data_dir = tmp_path / "wal" / "emb-1", tmp_path
    keys = log_of(log_dir, 10, 10, 10)
    original = segment(log_dir, 1).read_bytes()
    flip(segment(log_dir, 1), at(4) + 30)
    prefix: list[WalRecord] = []
    replayed = wal_segments.replay(log_dir, 0, prefix.append, stop_at_damage=True)
    assert [int(r.keys[0]) for r in prefix] == keys[:14]
    loss = wal_repair.cut(log_dir, 0, replayed, data_dir)
    assert loss.replayed == 14 and loss.writes_dropped == 15  # the damaged one not counted
    assert [(d.generation, d.offset, d.bytes, d.writes) for d in loss.dropped] == [
        (1, at(4), at(10) - at(4), 5),
        (2, 0, at(10), 10),
    ]
    assert "segment 000000000001.wal, offset" in loss.damage
    quarantine = loss.quarantine
    assert quarantine.parent == data_dir / wal_repair.QUARANTINE
    assert sorted(p.name for p in quarantine.iterdir()) == ["000000000001.wal", "000000000002.wal"]
    assert (quarantine / "000000000001.wal").read_bytes()[: at(4)] == original[: at(4)]
    assert keys_of(log_dir) == keys[:14]  # the log now ends where the damage was: verified
    log = TableWal(log_dir)  # and new writes follow the prefix
    log.append(payload(99))
    log.wait_durable()
    log.close()
    assert keys_of(log_dir) == [*keys[:14], 99]


def v2_segment(generation: int, keys: list[int], predecessor_end: int) -> bytes:
    """A segment of the previous format: a header without a length, grown record by record."""
    fields = wal.MAGIC_V2 + wal.SEGMENT_V2.pack(generation, predecessor_end, 0)[:-4]
    out = fields + zlib.crc32(fields).to_bytes(4, "little")
    return out + b"".join(wal.frame(payload(key), index) for index, key in enumerate(keys))


def test_a_log_of_the_format_before_is_read_with_its_rules_and_continued(tmp_path: Path) -> None:
    first = v2_segment(0, [0, 1, 2], wal.NO_PREDECESSOR)
    segment(tmp_path, 0).write_bytes(first + bytes(100))  # written past: ignored
    second = v2_segment(1, [3, 4], len(first))
    segment(tmp_path, 1).write_bytes(second + bytes(4096))  # space it got, never written
    assert keys_of(tmp_path) == [0, 1, 2, 3, 4]
    segment(tmp_path, 1).write_bytes(second[:-RECORD])  # its limit: a cut at a boundary
    assert keys_of(tmp_path) == [0, 1, 2, 3]
    segment(tmp_path, 1).write_bytes(second[:-10])  # a torn last record
    assert keys_of(tmp_path) == [0, 1, 2, 3]
    segment(tmp_path, 0).write_bytes(first[:-10])  # its successor records where it ended
    assert refused(tmp_path, 0, len(first) - RECORD).startswith("truncated")
    segment(tmp_path, 0).write_bytes(first)
    log = TableWal(tmp_path, segment_bytes=SEGMENT)
    log.append(payload(5))
    log.wait_durable()
    log.close()
    assert keys_of(tmp_path) == [0, 1, 2, 3, 5]


@pytest.mark.parametrize(("fixture", "magic"), [("wal_v1", wal.MAGIC_V1), ("wal_v2", wal.MAGIC_V2)])
def test_a_node_of_a_previous_release_restarts_on_this_one_with_every_write(
    tmp_path: Path, fixture: str, magic: bytes
) -> None:
    """``data/wal_v1``, ``data/wal_v2``: a WAL node's data dir as a previous release left
    it (two segments of its format, no checkpoint), with the rows it then served."""
    source = Path(__file__).parent / "data" / fixture
    data_dir = tmp_path / "node"
    shutil.copytree(source / "node", data_dir)
    expected = np.array(json.loads((source / "expected.json").read_text()), np.float32)
    keys = np.arange(len(expected))
    for _ in range(2):  # and again, once this release continued the log in its format
        handle = start_in_thread(data_dir=data_dir, durability="wal")
        try:
            client = Client(handle.address)
            np.testing.assert_array_equal(client.pull("emb", keys), expected)
            client.push("emb", [99], np.full((1, 4), 9.0, np.float32))
            expected_99 = client.pull("emb", [99])
        finally:
            handle.stop(final_checkpoint=False)
        np.testing.assert_array_equal(expected_99, np.full((1, 4), 9.0))
    (log_dir,) = (data_dir / "wal").iterdir()
    with_headers = [segment(log_dir, g).read_bytes()[:8] for g in range(4)]
    assert with_headers == [magic, magic, wal.MAGIC, wal.MAGIC]
