"""Write-ahead log format, group commit, replay and fail-stop, on plain numpy arrays."""

from __future__ import annotations

import asyncio
import errno
import math
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from recstore.core import WriteNotDurable, WritesStopped
from recstore.core.request_id import RequestId
from recstore.ps.wal import records as wal
from recstore.ps.wal import segments as wal_segments
from recstore.ps.wal.dedup import Entry
from recstore.ps.wal.records import OP_IMPORT, OP_PUSH, OP_UPDATE, WalRecord
from recstore.ps.wal.table_log import TableWal
from recstore.ps.wal.verify import WalDamaged
from recstore.ps.wal.write_gate import LogFault, WriteGate

from .wal_faults import FailingDisk


def record(op: int, keys: list[int], dim: int = 4, lr: float | None = None) -> bytes:
    """A record's payload (``TableWal.append`` frames it)."""
    k = np.array(keys, dtype="<i8")
    v = (np.arange(len(keys) * dim, dtype="<f4") + keys[0]).reshape(len(keys), dim)
    return wal.encode_record(op, k.tobytes(), v.tobytes(), "float32", len(keys), dim, lr)


def replayed(directory: Path, start: int = 0) -> list[WalRecord]:
    out: list[WalRecord] = []
    wal_segments.replay(directory, start, out.append)
    return out


def test_record_roundtrip() -> None:
    keys = np.array([5, -7, 2**40], dtype="<i8")
    values = np.random.default_rng(0).standard_normal((3, 8)).astype("<f2")
    payload = wal.encode_record(OP_UPDATE, keys.tobytes(), values.tobytes(), "float16", 3, 8, 0.5)
    decoded = wal.decode_payload(payload)
    assert decoded.op == OP_UPDATE and decoded.dtype == "float16" and decoded.lr == 0.5
    np.testing.assert_array_equal(decoded.keys, keys)
    np.testing.assert_array_equal(decoded.values, values)


@pytest.mark.parametrize("rows", [3, 0])
def test_import_record_carries_the_rows_optimizer_state(rows: int) -> None:
    keys = np.arange(rows, dtype="<i8")
    values = np.ones((rows, 4), "<f4")
    state = np.arange(rows * 12, dtype="<f4").reshape(rows, 12)
    payload = wal.encode_record(
        OP_IMPORT, keys.tobytes(), values.tobytes(), "float32", rows, 4, None, state.tobytes()
    )
    decoded = wal.decode_payload(payload)
    assert decoded.op == OP_IMPORT and decoded.state is not None
    np.testing.assert_array_equal(decoded.values, values)
    np.testing.assert_array_equal(decoded.state, state if rows else state.reshape(0, 0))


def test_no_lr_roundtrips_as_none() -> None:
    decoded = wal.decode_payload(record(OP_PUSH, [1]))
    assert decoded.lr is None
    assert not math.isnan(0.0)


@pytest.mark.parametrize("named", [False, True])
def test_a_record_says_the_epoch_its_write_was_applied_under(named: bool) -> None:
    keys, grads = np.array([3, 9], "<i8"), np.full((2, 4), 2.0, "<f4")
    request = Entry(RequestId("trainer", 12), b"d" * 16, (2,), np.empty(0, np.uint16))
    payload = wal.encode_record(
        OP_UPDATE, keys.tobytes(), grads.tobytes(), "float32", 2, 4, 1.0,
        request=request if named else None, epoch=2**40 + 7,
    )  # fmt: skip
    decoded = wal.decode_payload(payload)
    assert decoded.epoch == 2**40 + 7 and decoded.lr == 1.0
    np.testing.assert_array_equal(decoded.keys, keys)
    np.testing.assert_array_equal(decoded.values, grads)
    assert (decoded.request.request_id if decoded.request else None) == (
        RequestId("trainer", 12) if named else None
    )
    state = np.arange(2 * 12, dtype="<f4").reshape(2, 12)
    imported = wal.encode_record(
        OP_IMPORT, keys.tobytes(), grads.tobytes(), "float32", 2, 4, None, state.tobytes(),
        epoch=3,
    )  # fmt: skip
    decoded = wal.decode_payload(imported)
    assert decoded.epoch == 3 and decoded.state is not None
    np.testing.assert_array_equal(decoded.state, state)


def test_records_logged_before_epochs_replay_as_before(tmp_path: Path) -> None:
    """A log written before writes said their epoch (and before segments had a header):
    flags 0, the keys right after the head."""
    keys, values = np.array([4, 5], "<i8"), np.ones((2, 3), "<f4")
    head = wal.HEAD.pack(OP_PUSH, wal.DTYPE_CODES["float32"], 0, 2, 3, math.nan)
    payload = head + keys.tobytes() + values.tobytes()
    segment = wal.MAGIC_V1 + wal.FRAME_V1.pack(len(payload), zlib.crc32(payload)) + payload
    wal_segments.segment_path(tmp_path, 0).write_bytes(segment)
    (decoded,) = replayed(tmp_path)
    assert decoded.op == OP_PUSH and decoded.epoch is None and decoded.request is None
    np.testing.assert_array_equal(decoded.keys, keys)
    np.testing.assert_array_equal(decoded.values, values)


async def test_appends_are_durable_and_replay_in_order(tmp_path: Path) -> None:
    log = TableWal(tmp_path)
    seqs = [log.append(record(OP_PUSH if i % 2 else OP_UPDATE, [i, i + 1])).seq for i in range(50)]
    await asyncio.gather(*(log.durable(s) for s in seqs))
    log.close()
    out = replayed(tmp_path)
    assert [int(r.keys[0]) for r in out] == list(range(50))
    assert [r.op for r in out] == [OP_PUSH if i % 2 else OP_UPDATE for i in range(50)]


async def test_concurrent_writers_share_fsyncs(tmp_path: Path, monkeypatch) -> None:
    fsyncs = 0
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        real_fsync(fd)

    log = TableWal(tmp_path)
    monkeypatch.setattr(os, "fsync", counting_fsync)

    async def writer(i: int) -> None:
        await log.durable(log.append(record(OP_PUSH, [i])).seq)

    await asyncio.gather(*(writer(i) for i in range(200)))
    log.close()
    assert len(replayed(tmp_path)) == 200
    assert fsyncs < 200  # group commit: one fsync covers many appends


def test_a_torn_tail_is_ignored_and_a_cut_refused(tmp_path: Path) -> None:
    log = TableWal(tmp_path)
    for i in range(3):
        log.append(record(OP_PUSH, [i], dim=200))  # records that span sectors
    log.wait_durable()
    log.close()
    segment = wal_segments.segment_path(tmp_path, 0)
    last = wal.HEADER_SIZE + 2 * (wal.FRAME.size + len(record(OP_PUSH, [0], dim=200)))
    end = last + wal.FRAME.size + len(record(OP_PUSH, [0], dim=200))
    assert segment.stat().st_size == wal.SEGMENT_BYTES  # created at its full length
    with open(segment, "r+b") as handle:  # the last record's last sector never written
        handle.seek(end // 512 * 512)
        handle.write(bytes(end % 512))
    assert [int(r.keys[0]) for r in replayed(tmp_path)] == [0, 1]
    os.truncate(segment, end)  # a cut, even past every record, is damage
    with pytest.raises(WalDamaged, match=f"offset {last}: truncated: the segment is {end} bytes"):
        replayed(tmp_path)


def test_a_corrupt_record_with_records_after_it_is_damage_not_an_end(tmp_path: Path) -> None:
    log = TableWal(tmp_path)
    for i in range(3):
        log.append(record(OP_PUSH, [i]))
    log.wait_durable()
    log.close()
    segment = wal_segments.segment_path(tmp_path, 0)
    data = bytearray(segment.read_bytes())
    second = wal.HEADER_SIZE + wal.FRAME.size + len(record(OP_PUSH, [0]))
    data[second + wal.FRAME.size + 3] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises(WalDamaged) as damaged:
        replayed(tmp_path)
    assert str(damaged.value) == (
        f"segment 000000000000.wal, offset {second}: checksum mismatch; 1 intact records follow it"
    )
    prefix: list[WalRecord] = []
    stopped = wal_segments.replay(tmp_path, 0, prefix.append, stop_at_damage=True)
    assert [int(r.keys[0]) for r in prefix] == [0] and stopped.damage is not None
    assert (stopped.newest, stopped.end) == (0, second)


def test_rotate_and_restart_use_new_segments(tmp_path: Path) -> None:
    log = TableWal(tmp_path)
    log.append(record(OP_PUSH, [1]))
    generation = log.rotate()
    log.append(record(OP_PUSH, [2]))
    log.wait_durable()
    log.close()
    assert generation == 1
    assert [int(r.keys[0]) for r in replayed(tmp_path, generation)] == [2]
    assert [int(r.keys[0]) for r in replayed(tmp_path, 0)] == [1, 2]
    reopened = TableWal(tmp_path)  # a restarted node appends to a fresh segment
    assert reopened.generation == 2
    reopened.remove_before(2)
    reopened.close()
    assert wal_segments.generations(tmp_path) == [2]
    assert replayed(tmp_path, 2) == []


def first_keys(directory: Path) -> list[int]:
    return [int(r.keys[0]) for r in replayed(directory)]


def test_a_record_that_cannot_be_written_is_refused_and_cut_back_out(tmp_path: Path) -> None:
    disk = FailingDisk()
    log = TableWal(tmp_path, table="emb", files=disk)
    log.append(record(OP_PUSH, [1]))
    log.wait_durable()
    segment = wal_segments.segment_path(tmp_path, log.generation)
    written = segment.read_bytes()
    disk.fail_writes(errno.ENOSPC, torn=True)  # half the record reaches the file
    with pytest.raises(WritesStopped, match="No space left on device") as refused:
        log.append(record(OP_PUSH, [2]))
    assert "nothing of this request was applied" in str(refused.value)
    assert segment.read_bytes() == written  # the torn half was cut back out
    fault = log.gate.fault
    assert fault is not None and (fault.table, fault.operation, fault.errno_name) == (
        "emb",
        "write",
        "ENOSPC",
    )
    assert not log.gate.needs_checkpoint  # nothing was applied that the log lacks
    disk.heal()
    with pytest.raises(WritesStopped):  # the log stays stopped until it is reopened
        log.append(record(OP_PUSH, [3]))
    log.reopen()
    log.gate.reopen()
    log.append(record(OP_PUSH, [4]))
    log.wait_durable()
    log.close()
    assert wal_segments.generations(tmp_path) == [0, 1]  # it continued on a fresh segment
    assert first_keys(tmp_path) == [1, 4]


async def test_a_failed_fsync_fails_the_waiting_writer_and_cuts_the_segment_back(
    tmp_path: Path,
) -> None:
    disk = FailingDisk()
    log = TableWal(tmp_path, table="emb", files=disk)
    await log.durable(log.append(record(OP_PUSH, [1])).seq)
    disk.fail_syncs(errno.EIO)
    late = log.append(record(OP_PUSH, [2]))  # written, so its writer applies it
    with pytest.raises(WriteNotDurable, match="Input/output error"):
        await log.durable(late.seq)
    with pytest.raises(WriteNotDurable):  # asked again, the answer stays
        log.wait_durable(late.seq)
    log.wait_durable(1)  # the record fsynced before stays acknowledged
    assert log.gate.fault is not None and log.gate.fault.operation == "fsync"
    assert log.gate.needs_checkpoint  # memory holds a write the log lost
    with pytest.raises(WritesStopped):
        log.append(record(OP_PUSH, [3]))
    disk.heal()
    log.reopen()
    with pytest.raises(WriteNotDurable):  # a fresh segment does not make it durable
        await log.durable(late.seq)
    log.close()
    assert first_keys(tmp_path) == [1]  # a restart replays only what was acknowledged


def test_reopening_fails_while_the_disk_still_fails_and_leaves_no_segment(tmp_path: Path) -> None:
    disk = FailingDisk()
    log = TableWal(tmp_path, table="emb", files=disk)
    disk.fail_writes(errno.ENOSPC, torn=False)
    with pytest.raises(WritesStopped):
        log.append(record(OP_PUSH, [1]))
    with pytest.raises(OSError, match="No space left"):
        log.reopen()
    assert wal_segments.generations(tmp_path) == [0]  # the probe's half-made segment is gone
    assert log.fault is not None
    disk.heal()
    log.reopen()
    assert log.fault is None and wal_segments.generations(tmp_path) == [0, 1]
    log.close()


def test_a_failure_in_one_log_stops_the_logs_sharing_its_gate(tmp_path: Path) -> None:
    gate, disk = WriteGate(), FailingDisk()
    first = TableWal(tmp_path / "a", table="a", gate=gate, files=disk)
    second = TableWal(tmp_path / "b", table="b", gate=gate, files=disk)
    disk.fail_writes(errno.ENOSPC, where=lambda path: path.parent.name == "a")
    with pytest.raises(WritesStopped):
        first.append(record(OP_PUSH, [1]))
    with pytest.raises(WritesStopped, match="table 'a'"):  # its own disk works, still refused
        second.append(record(OP_PUSH, [2]))
    assert gate.fault_counts() == {"write": 1}
    first.close()
    second.close()
    assert replayed(tmp_path / "b") == []


def test_retract_cuts_the_last_records_back_out(tmp_path: Path) -> None:
    log = TableWal(tmp_path)
    log.append(record(OP_PUSH, [1]))
    second = log.append(record(OP_PUSH, [2]))
    third = log.append(record(OP_PUSH, [3]))
    with pytest.raises(RuntimeError, match="only the last record"):
        log.retract(second)
    log.retract(third)
    log.retract(second)
    log.append(record(OP_PUSH, [4]))
    log.wait_durable()
    log.close()
    assert first_keys(tmp_path) == [1, 4]


def test_the_gate_stays_shut_when_a_log_fails_while_writes_resume() -> None:
    gate = WriteGate()
    first = LogFault.of("a", "write", "/a", OSError(errno.ENOSPC, "No space left on device"))
    gate.trip(first)
    seen = gate.trips()  # the probe starts: every failed log is reopened ...
    gate.trip(LogFault.of("b", "fsync", "/b", OSError(errno.EIO, "Input/output error")))
    assert not gate.reopen(seen)  # ... but another log failed meanwhile
    assert gate.fault == first
    with pytest.raises(WritesStopped, match=r"table 'a'.*\[ENOSPC\]"):
        gate.check()
    assert gate.reopen(gate.trips())
    gate.check()
    assert gate.fault_counts() == {"write": 1, "fsync": 1}


def test_reaches_back_until_trimmed_and_a_gap_is_the_replays_to_find(tmp_path: Path) -> None:
    assert not wal_segments.reaches_back(tmp_path, 0)  # no log at all
    log = TableWal(tmp_path)
    for _ in range(3):
        log.rotate()
    log.close()
    assert wal_segments.reaches_back(tmp_path, 0) and wal_segments.reaches_back(tmp_path, 2)
    assert not wal_segments.reaches_back(tmp_path, 4)  # beyond the newest segment
    wal_segments.segment_path(tmp_path, 1).unlink()  # a gap: a replay across it is refused
    assert wal_segments.reaches_back(tmp_path, 0) and wal_segments.reaches_back(tmp_path, 2)
    with pytest.raises(WalDamaged, match=r"segment 000000000001\.wal, offset 0: the segment is "
                       r"missing \(segments present from there: 0, 2\.\.3"):  # fmt: skip
        replayed(tmp_path)
    assert replayed(tmp_path, 2) == []
    wal_segments.segment_path(tmp_path, 0).unlink()  # trimmed: no longer reaches back to 0
    assert not wal_segments.reaches_back(tmp_path, 0)
