"""Damaged checkpoints: recovery verifies, falls back loudly, and never serves less.

The node restores each table from its newest checkpoint that verifies and, in
WAL mode, replays the log from that checkpoint's generation; a table nothing
valid restores is refused (FAILED_PRECONDITION, ``Recovered=False``), never
served empty. Real nodes on loopback: subprocesses killed with SIGKILL, or
in-process nodes stopped without a final checkpoint.
"""

from __future__ import annotations

import functools
import json
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core.proto_convert import table_stats_from_proto
from recstore.core.wire import WireClient
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.checkpoint import write as checkpoint
from recstore.ps.serve.server import ServerHandle
from recstore.store import Table
from recstore.v1 import ps_pb2

from .conftest import Client, spec

WAL = ("--durability", "wal", "--metrics-port", "0")


def table_spec() -> Any:
    return spec(optimizer={"kind": "adam", "lr": 0.05})


def damage(data_dir: Path, checkpoint_id: str, part: str = "values", table: str = "emb") -> None:
    """Flip a few bytes of one file of a checkpoint (``manifest``: its manifest)."""
    directory = data_dir / "checkpoints" / checkpoint_id
    path = directory / checkpoint.MANIFEST if part == "manifest" else None
    path = path or directory / "tables" / table / f"{part}.bin"
    data = bytearray(path.read_bytes())
    for offset in (len(data) // 3, len(data) // 2):
        data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


class Writes:
    """r0, r1, r2 of the scenario, applied to the node and to an in-process oracle."""

    def __init__(self, client: Client | None) -> None:
        self.client = client  # None: the oracle alone
        self.oracle = Table(table_spec())
        self.rng = np.random.default_rng(7)

    def push(self, keys: np.ndarray) -> None:
        values = self.rng.standard_normal((len(keys), 8)).astype(np.float32)
        if self.client is not None:
            self.client.push("emb", keys, values)
        self.oracle.push(keys, values)

    def update(self, keys: np.ndarray) -> None:
        grads = self.rng.standard_normal((len(keys), 8)).astype(np.float32)
        if self.client is not None:
            self.client.update("emb", keys, grads)
        self.oracle.update(keys, grads)

    def r(self, step: int) -> None:
        self.push(np.arange(10 * step, 10 * step + 10))
        self.update(np.arange(0, 10 * step + 10, 3))


def written(client: Client, *checkpoint_ids: str) -> Writes:
    """The table created, then r0, a save as the first id, r1, a save as the next, ... and
    one r more after the last save; the writes (and their oracle) returned."""
    client.create(table_spec())
    writes = Writes(client)
    for step, checkpoint_id in enumerate(checkpoint_ids):
        writes.r(step)
        client.save(checkpoint_id)
    writes.r(len(checkpoint_ids))
    return writes


KEYS = np.arange(30)


def conditions(client: Client, table: str = "emb") -> list[Any]:
    listed = client.call("ListTables", ps_pb2.ListTablesRequest())
    (stats,) = [t for t in listed.tables if t.table == table]
    return list(table_stats_from_proto(stats).conditions)


def scrape(node: Any) -> dict[str, float]:
    """The subprocess node's /metrics, as {'name{labels}': value}."""
    (serving,) = [json.loads(line) for line in node.log if '"ps node serving"' in line]
    url = f"http://127.0.0.1:{serving['metrics_port']}/metrics"
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def test_wal_node_passes_over_a_damaged_checkpoint_and_keeps_every_write(
    tmp_path: Path, spawn: Any
) -> None:
    node = spawn(tmp_path, *WAL)
    client = Client(node.address)
    writes = written(client, "A", "B")
    node.kill()
    damage(tmp_path, "B")
    restarted = spawn(tmp_path, *WAL)
    again = Client(restarted.address)
    np.testing.assert_array_equal(again.pull("emb", KEYS), writes.oracle.pull(KEYS))
    (condition,) = conditions(again)
    assert (condition.type, condition.status) == ("Recovered", True)
    assert condition.reason == "FellBackToOlderCheckpoint"
    assert "'B'" in condition.message and "sha256" in condition.message
    assert scrape(restarted)['recstore_ps_checkpoint_corrupt_total{table="emb"}'] == 1
    assert any('"checkpoint damaged' in line for line in restarted.log)


@pytest.mark.parametrize("part", ["values", "manifest"])
def test_wal_node_with_every_checkpoint_damaged_refuses_the_table(
    tmp_path: Path, spawn: Any, part: str
) -> None:
    node = spawn(tmp_path, *WAL)
    client = Client(node.address)
    written(client, "A", "B")
    node.kill()
    damage(tmp_path, "A", part)
    damage(tmp_path, "B", part)
    for _ in range(2):  # and stays refused over restarts: the catalogue keeps it
        restarted = spawn(tmp_path, *WAL)
        again = Client(restarted.address)
        for method, *args in (
            ("pull", "emb", KEYS),
            ("push", "emb", KEYS[:1], np.ones((1, 8), np.float32)),
            ("create", table_spec()),  # never recreated empty
        ):
            with pytest.raises(grpc.RpcError) as refused:
                getattr(again, method)(*args)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "table 'emb' is not served" in refused.value.details()
        (condition,) = conditions(again)
        assert (condition.type, condition.status) == ("Recovered", False)
        metrics = scrape(restarted)
        assert metrics['recstore_ps_table_unrecoverable{table="emb"}'] == 1
        label = "emb" if part == "values" else ""
        assert metrics[f'recstore_ps_checkpoint_corrupt_total{{table="{label}"}}'] == 2
        again.save()  # other saves go on; the damaged checkpoints are not pruned
        restarted.kill()
    assert {"A", "B"} <= {p.name for p in (tmp_path / "checkpoints").iterdir()}
    restarted = spawn(tmp_path, *WAL)
    again = Client(restarted.address)
    again.call("DropTable", ps_pb2.DropTableRequest(table="emb"))  # the operator gives up
    again.create(table_spec())
    _, found = again.find("emb", KEYS)
    assert not found.any()


def test_a_log_complete_from_the_start_restores_a_table_no_checkpoint_does(
    tmp_path: Path, spawn: Any
) -> None:
    node = spawn(tmp_path, *WAL)
    client = Client(node.address)
    client.save("A")  # before the table exists: recovering from A needs the whole log
    client.create(table_spec())
    writes = Writes(client)
    writes.r(0)
    client.save("B")
    writes.r(1)
    node.kill()
    damage(tmp_path, "B")
    again = Client(spawn(tmp_path, *WAL).address)
    np.testing.assert_array_equal(again.pull("emb", KEYS), writes.oracle.pull(KEYS))
    (condition,) = conditions(again)
    assert (condition.status, condition.reason) == (True, "ReplayedLogFromStart")


# -- in-process nodes (the ``start`` fixture) ------------------------------------------
def corrupt_count(handle: ServerHandle, table: str = "emb") -> float:
    registry = handle.server.metrics.registry
    return registry.get_sample_value("recstore_ps_checkpoint_corrupt_total", {"table": table}) or 0


def test_checkpoint_mode_falls_back_to_the_newest_valid_checkpoint_loudly(
    tmp_path: Path, start: Any
) -> None:
    _, client = start()
    client.create(table_spec())
    writes = Writes(client)
    snapshots = {}
    for step, checkpoint_id in enumerate("ABC"):
        writes.r(step)
        client.save(checkpoint_id)
        snapshots[checkpoint_id] = writes.oracle.find(KEYS)[0]
    damage(tmp_path, "C")
    handle, again = start()
    values, found = again.find("emb", KEYS)
    np.testing.assert_array_equal(values[found], snapshots["B"][found])  # B: not A, not empty
    assert found[:20].all() and not found[20:].any()
    reply = again.call("GetTableStats", ps_pb2.GetTableStatsRequest(table="emb"))
    stats = table_stats_from_proto(reply)
    (condition,) = stats.conditions
    assert condition.reason == "FellBackToOlderCheckpoint" and "'B'" in condition.message
    assert corrupt_count(handle) == 1


def test_checkpoint_mode_with_every_checkpoint_damaged_refuses(tmp_path: Path, start: Any) -> None:
    _, client = start()
    client.create(table_spec())
    client.create(spec("intact"))
    Writes(client).r(0)
    client.save("A")
    damage(tmp_path, "A")
    handle, again = start()
    with pytest.raises(grpc.RpcError) as refused:
        again.pull("emb", KEYS)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'emb'" in refused.value.details() and "sha256" in refused.value.details()
    again.pull("intact", KEYS)  # the other table of the checkpoint verified: served
    assert again.names() == ["emb", "intact"]
    with grpc.insecure_channel(handle.address) as channel:
        fast = WireClient(channel, timeout=60)
        grads = np.ones((2, 8), np.float32)
        for call in (
            functools.partial(fast.multi_pull, [("intact", KEYS[:2]), ("emb", KEYS[:2])]),
            functools.partial(
                fast.multi_update, [("intact", KEYS[:2], grads), ("emb", KEYS[:2], grads)]
            ),
        ):
            with pytest.raises(grpc.RpcError) as multi:
                call()
            assert multi.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # a node that declares the table at start hosts it refused, not created anew
    _, declared = start(table_specs=[table_spec()])
    with pytest.raises(grpc.RpcError) as still:
        declared.pull("emb", KEYS)
    assert still.value.code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("part", ["values", "state", "manifest"])
def test_load_of_a_damaged_checkpoint_is_refused_and_changes_nothing(
    tmp_path: Path, start: Any, part: str
) -> None:
    handle, client = start("wal")
    writes = written(client, "A", "B")
    damage(tmp_path, "A", part)
    with pytest.raises(grpc.RpcError) as refused:
        client.call("Load", ps_pb2.LoadRequest(checkpoint_id="A"))
    assert refused.value.code() == grpc.StatusCode.DATA_LOSS
    assert "checkpoint 'A'" in refused.value.details()
    np.testing.assert_array_equal(client.pull("emb", KEYS), writes.oracle.pull(KEYS))
    assert corrupt_count(handle, "" if part == "manifest" else "emb") == 1
    _, again = start("wal")  # nor did it touch what a restart restores
    np.testing.assert_array_equal(again.pull("emb", KEYS), writes.oracle.pull(KEYS))


def test_a_checkpoint_that_does_not_verify_after_writing_keeps_the_log(
    tmp_path: Path, start: Any, monkeypatch: Any
) -> None:
    _, client = start("wal")
    writes = written(client, "A")
    commit = checkpoint.CheckpointWriter.commit

    def torn_commit(self: checkpoint.CheckpointWriter) -> checkpoint.CheckpointInfo:
        info = commit(self)
        damage(tmp_path, info.checkpoint_id)  # e.g. a write the device lost
        return info

    monkeypatch.setattr(checkpoint.CheckpointWriter, "commit", torn_commit)
    with pytest.raises(grpc.RpcError) as failed:
        client.save("B")
    assert failed.value.code() == grpc.StatusCode.DATA_LOSS
    assert "did not verify after writing" in failed.value.details()
    monkeypatch.undo()
    assert not (tmp_path / "checkpoints" / "B").exists()
    writes.r(2)
    _, again = start("wal")
    np.testing.assert_array_equal(again.pull("emb", KEYS), writes.oracle.pull(KEYS))
    assert conditions(again) == []  # the damaged one was never kept


def test_a_final_checkpoint_that_does_not_verify_still_releases_the_data_dir(
    tmp_path: Path, start: Any, monkeypatch: Any
) -> None:
    from recstore.ps.serve.serving import FinalCheckpointFailed

    handle, client = start("wal")
    writes = written(client)
    commit = checkpoint.CheckpointWriter.commit

    def torn_commit(self: checkpoint.CheckpointWriter) -> checkpoint.CheckpointInfo:
        info = commit(self)
        damage(tmp_path, info.checkpoint_id)
        return info

    monkeypatch.setattr(checkpoint.CheckpointWriter, "commit", torn_commit)
    with pytest.raises(FinalCheckpointFailed, match="did not verify"):
        handle.stop(final_checkpoint=True)
    monkeypatch.undo()
    _, again = start("wal")  # the lock was released; the log still holds every write
    np.testing.assert_array_equal(again.pull("emb", KEYS), writes.oracle.pull(KEYS))


def test_the_log_reaches_back_to_the_oldest_kept_checkpoint(tmp_path: Path, start: Any) -> None:
    from recstore.ps.wal import segments as wal_segments

    _, client = start("wal", keep_checkpoints=2)
    client.create(table_spec())
    writes = Writes(client)
    saved = []
    for step in range(4):
        writes.r(step % 3)
        saved.append(client.save(f"c{step}").checkpoint_id)
        kept = checkpoint_read.list_checkpoints(tmp_path / "checkpoints")
        assert [c.checkpoint_id for c in kept] == saved[-2:]
        (log_dir,) = (tmp_path / "wal").iterdir()
        oldest = kept[0].manifest["tables"]["emb"]["wal_generation"]
        assert wal_segments.generations(log_dir)[0] == oldest  # nothing older, nothing newer lost
    damage(tmp_path, "c3")
    _, again = start("wal")
    np.testing.assert_array_equal(again.pull("emb", KEYS), writes.oracle.pull(KEYS))


def test_after_a_load_no_checkpoint_before_it_is_a_base_for_the_log(
    tmp_path: Path, start: Any
) -> None:
    _, client = start("wal")
    written(client, "A")
    client.save("B")
    client.call("Load", ps_pb2.LoadRequest(checkpoint_id="A"))
    loaded = Writes(None)  # the same r0 as the node's: its oracle is at A
    loaded.r(0)
    loaded.client = client
    loaded.r(2)
    _, again = start("wal")
    np.testing.assert_array_equal(again.pull("emb", KEYS), loaded.oracle.pull(KEYS))
    (after_load,) = [c for c in again.call("ListCheckpoints", ps_pb2.ListCheckpointsRequest())
                     .checkpoints if c.checkpoint_id not in ("A", "B")]  # fmt: skip
    damage(tmp_path, after_load.checkpoint_id)
    # B plus the log would be a state that never existed (the writes before the Load
    # and after it): refused, not served
    _, refused = start("wal")
    with pytest.raises(grpc.RpcError) as error:
        refused.pull("emb", KEYS)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no longer reaches back" in error.value.details()


def test_a_load_of_a_valid_checkpoint_ends_a_refusal(tmp_path: Path, start: Any) -> None:
    from recstore.ps.wal import segments as wal_segments

    _, client = start("wal")
    writes = written(client, "A")
    at_b = client.save("B")
    expected = writes.oracle.find(KEYS)[0]
    writes.r(2)
    (log_dir,) = (tmp_path / "wal").iterdir()
    start("wal")  # a restart opens a fresh segment: B's own is closed now
    lost_with_r2 = wal_segments.generations(log_dir)[-2]
    wal_segments.segment_path(log_dir, lost_with_r2).unlink()
    _, refused = start("wal")
    with pytest.raises(grpc.RpcError) as error:
        refused.pull("emb", KEYS)
    assert f"segment {lost_with_r2:012d}.wal, offset 0: the segment is missing" in (
        error.value.details()
    )
    refused.call("Load", ps_pb2.LoadRequest(checkpoint_id=at_b.checkpoint_id))  # accept B
    values, found = refused.find("emb", KEYS)
    np.testing.assert_array_equal(values[found], expected[found])
    assert conditions(refused) == []
    _, restarted = start("wal")  # and served over restarts from the new base
    np.testing.assert_array_equal(restarted.find("emb", KEYS)[0][found], expected[found])
