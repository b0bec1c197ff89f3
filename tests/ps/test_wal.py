"""Write-ahead log format, group commit and replay, on plain numpy arrays."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from recstore.ps import wal
from recstore.ps.wal import OP_PUSH, OP_UPDATE, TableWal, WalRecord


def record(op: int, keys: list[int], dim: int = 4, lr: float | None = None) -> bytes:
    k = np.array(keys, dtype="<i8")
    v = (np.arange(len(keys) * dim, dtype="<f4") + keys[0]).reshape(len(keys), dim)
    return wal.encode_record(op, k.tobytes(), v.tobytes(), "float32", len(keys), dim, lr)


def replayed(directory: Path, start: int = 0) -> list[WalRecord]:
    out: list[WalRecord] = []
    wal.replay(directory, start, out.append)
    return out


def test_record_roundtrip() -> None:
    keys = np.array([5, -7, 2**40], dtype="<i8")
    values = np.random.default_rng(0).standard_normal((3, 8)).astype("<f2")
    framed = wal.encode_record(OP_UPDATE, keys.tobytes(), values.tobytes(), "float16", 3, 8, 0.5)
    (decoded,) = wal.iter_records(wal.MAGIC + framed)
    assert decoded.op == OP_UPDATE and decoded.dtype == "float16" and decoded.lr == 0.5
    np.testing.assert_array_equal(decoded.keys, keys)
    np.testing.assert_array_equal(decoded.values, values)


def test_no_lr_roundtrips_as_none() -> None:
    (decoded,) = wal.iter_records(wal.MAGIC + record(OP_PUSH, [1]))
    assert decoded.lr is None
    assert not math.isnan(0.0)


async def test_appends_are_durable_and_replay_in_order(tmp_path: Path) -> None:
    log = TableWal(tmp_path)
    seqs = [log.append(record(OP_PUSH if i % 2 else OP_UPDATE, [i, i + 1])) for i in range(50)]
    await asyncio.gather(*(log.durable(s) for s in seqs))
    log.close()
    out = replayed(tmp_path)
    assert [int(r.keys[0]) for r in out] == list(range(50))
    assert [r.op for r in out] == [OP_PUSH if i % 2 else OP_UPDATE for i in range(50)]


async def test_concurrent_writers_share_fsyncs(tmp_path: Path, monkeypatch) -> None:
    fsyncs = 0
    real_fsync = wal.os.fsync

    def counting_fsync(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        real_fsync(fd)

    log = TableWal(tmp_path)
    monkeypatch.setattr(wal.os, "fsync", counting_fsync)

    async def writer(i: int) -> None:
        await log.durable(log.append(record(OP_PUSH, [i])))

    await asyncio.gather(*(writer(i) for i in range(200)))
    log.close()
    assert len(replayed(tmp_path)) == 200
    assert fsyncs < 200  # group commit: one fsync covers many appends


@pytest.mark.parametrize("cut", [1, 5, 8, 20])
def test_torn_tail_is_ignored(tmp_path: Path, cut: int) -> None:
    log = TableWal(tmp_path)
    for i in range(3):
        log.append(record(OP_PUSH, [i]))
    log.wait_durable()
    log.close()
    segment = wal.segment_path(tmp_path, 0)
    data = segment.read_bytes()
    segment.write_bytes(data[:-cut])  # the last record was being written when the node died
    assert [int(r.keys[0]) for r in replayed(tmp_path)] == [0, 1]


def test_corrupt_record_stops_the_segment(tmp_path: Path) -> None:
    log = TableWal(tmp_path)
    for i in range(3):
        log.append(record(OP_PUSH, [i]))
    log.wait_durable()
    log.close()
    segment = wal.segment_path(tmp_path, 0)
    data = bytearray(segment.read_bytes())
    second = len(wal.MAGIC) + len(record(OP_PUSH, [0]))
    data[second + wal.FRAME.size + 3] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert [int(r.keys[0]) for r in replayed(tmp_path)] == [0]


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
    assert wal.generations(tmp_path) == [2]
    assert replayed(tmp_path) == []


def test_reaches_back_needs_every_segment_from_the_generation(tmp_path: Path) -> None:
    assert not wal.reaches_back(tmp_path, 0)  # no log at all
    log = TableWal(tmp_path)
    for _ in range(3):
        log.rotate()
    log.close()
    assert wal.reaches_back(tmp_path, 0) and wal.reaches_back(tmp_path, 2)
    assert not wal.reaches_back(tmp_path, 4)  # beyond the newest segment
    wal.segment_path(tmp_path, 1).unlink()  # a gap
    assert not wal.reaches_back(tmp_path, 0) and wal.reaches_back(tmp_path, 2)
