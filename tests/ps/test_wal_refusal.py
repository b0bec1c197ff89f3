"""A WAL node whose log is damaged refuses that table alone, loudly; the operator may accept
the loss of what follows the damage, explicitly.

Real nodes on loopback: in-process ones stopped as a crash stops them (no final
checkpoint), and a subprocess killed with SIGKILL. A table takes 300
acknowledged single-key updates over three log segments (each restart starts
one), its log is damaged on disk, and the node starts again; another table on
the node must go on serving throughout.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from typer.testing import CliRunner

from recstore.cli import app
from recstore.core.control import ControlClient, recover_table_rpc
from recstore.ps.wal import repair as wal_repair
from recstore.ps.wal.scan import record_starts
from recstore.ps.wal.segments import segment_path
from recstore.store import Table
from recstore.v1 import ps_pb2

from .conftest import Client, spec

KEYS = np.arange(40)
PER_SEGMENT = 100


def table_spec() -> Any:
    return spec(optimizer={"kind": "adam", "lr": 0.05}, checkpoint={"durability": "wal"})


class Updates:
    """The single-key updates sent, and the table they make after the first ``n``."""

    def __init__(self) -> None:
        rng = np.random.default_rng(33)
        self.sent: list[tuple[int, np.ndarray]] = [
            (int(rng.integers(0, len(KEYS))), rng.standard_normal((1, 8)).astype(np.float32))
            for _ in range(3 * PER_SEGMENT)
        ]

    def send(self, client: Client, first: int, count: int) -> None:
        for key, grad in self.sent[first : first + count]:
            client.update("emb", [key], grad)  # acknowledged once it returns

    def table_after(self, n: int) -> Table:
        oracle = Table(table_spec())
        for key, grad in self.sent[:n]:
            oracle.update(np.array([key]), grad)
        return oracle

    def after(self, n: int) -> np.ndarray:
        return self.table_after(n).pull(KEYS)


def log_dir(data_dir: Path) -> Path:
    (directory,) = (data_dir / "wal").glob("emb-*")
    return directory


def offsets(path: Path) -> list[int]:
    """Where each record of a segment starts (the first is its de-dup window record)."""
    return record_starts(path.read_bytes())


def three_segments(start: Any) -> Updates:
    """emb's 300 updates over segments 0, 1, 2 (a restart between each 100); 'other' too."""
    updates = Updates()
    _, client = start("wal")
    client.create(table_spec())
    client.create(spec("other", initializer={"kind": "zeros"}))
    for segment in range(3):
        if segment:
            _, client = start("wal")
        updates.send(client, segment * PER_SEGMENT, PER_SEGMENT)
        client.push("other", [segment], np.full((1, 8), segment + 1.0, np.float32))
    return updates


def flip_record(directory: Path) -> None:
    path = segment_path(directory, 1)
    data = bytearray(path.read_bytes())
    data[offsets(path)[51] + 40] ^= 0x04  # inside update 150's payload
    path.write_bytes(bytes(data))


def bad_magic(directory: Path) -> None:
    path = segment_path(directory, 1)
    path.write_bytes(b"X" + path.read_bytes()[1:])


def cut_middle(directory: Path) -> None:
    path = segment_path(directory, 1)
    path.write_bytes(path.read_bytes()[: offsets(path)[51] + 10])


def cut_newest(into: int) -> Callable[[Path], None]:
    """The newest segment cut ``into`` bytes past the start of update 250 (its 51st record)."""

    def act(directory: Path) -> None:
        path = segment_path(directory, 2)
        os.truncate(path, offsets(path)[51] + into)

    return act


def drop_segment(generation: int) -> Callable[[Path], None]:
    return lambda directory: segment_path(directory, generation).unlink()


@dataclass(frozen=True)
class Damage:
    """What a damage does to emb's log, where the replay must stop (segment, and record
    of it or None: its start), what it says, how many updates the intact prefix holds,
    and what accepting the loss drops (segments, intact updates)."""

    act: Callable[[Path], None]
    generation: int
    record: int | None
    problem: str
    kept: int
    cut_segments: list[int]
    cut_updates: int


GAP = "the segment is missing (segments present from there: 0, 2"
DAMAGES = {
    "bit flipped mid-segment": Damage(
        flip_record, 1, 51, "checksum mismatch; 49 intact records follow it", 150, [1, 2], 149
    ),
    "bad segment magic": Damage(
        bad_magic, 1, None, "bad segment magic b'XSWAL003'", 100, [1, 2], 200
    ),
    "middle segment cut mid-record": Damage(cut_middle, 1, 51, "truncated", 150, [1, 2], 100),
    "newest segment cut mid-record": Damage(
        cut_newest(10), 2, 51, "truncated: the segment is", 250, [2], 0
    ),
    "newest segment cut at a record boundary": Damage(
        cut_newest(0), 2, 51, "truncated: the segment is", 250, [2], 0
    ),
    "newest segment missing": Damage(
        drop_segment(2), 2, None, "the segment is missing", 200, [], 0
    ),
    "a gap": Damage(drop_segment(1), 1, None, GAP, 100, [2], 100),
}


@pytest.mark.parametrize("kind", DAMAGES)
def test_a_damaged_log_refuses_its_table_alone_until_the_loss_is_accepted(
    tmp_path: Path, start: Any, kind: str
) -> None:
    damage = DAMAGES[kind]
    generation, record, problem, kept = (
        damage.generation, damage.record, damage.problem, damage.kept,
    )  # fmt: skip
    updates = three_segments(start)
    directory = log_dir(tmp_path)
    offset = 0 if record is None else offsets(segment_path(directory, generation))[record]
    damage.act(directory)
    handle, client = start("wal")
    where = f"segment {generation:012d}.wal, offset {offset}: "
    for call in (lambda: client.pull("emb", KEYS),
                 lambda: client.update("emb", [1], np.ones((1, 8), np.float32))):  # fmt: skip
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details()
        assert "table 'emb' is not served" in details and where + problem in details, details
    # nothing else on the node is affected
    np.testing.assert_array_equal(client.pull("other", [0, 1, 2])[:, 0], [1.0, 2.0, 3.0])
    client.push("other", [3], np.full((1, 8), 4.0, np.float32))
    listed = client.call("ListTables", ps_pb2.ListTablesRequest())
    (stats,) = [t for t in listed.tables if t.table == "emb"]
    (condition,) = stats.conditions
    assert (condition.type, condition.status, condition.reason) == ("Recovered", False,
                                                                    "LogDamaged")  # fmt: skip
    registry = handle.server.metrics.registry
    assert registry.get_sample_value("recstore_ps_wal_damaged_total", {"table": "emb"}) == 1
    assert registry.get_sample_value("recstore_ps_table_unrecoverable", {"table": "emb"}) == 1

    with ControlClient(handle.address) as control:
        with pytest.raises(Exception, match="is not served"):  # asked again, the log is still bad
            control.call(recover_table_rpc("emb"))
        recovered = control.call(recover_table_rpc("emb", accept_log_loss=True))
    assert where + problem in recovered.damage
    assert recovered.replayed_records == kept
    assert [d.generation for d in recovered.dropped] == damage.cut_segments
    assert recovered.writes_dropped == damage.cut_updates
    quarantine = tmp_path / recovered.quarantine
    assert quarantine.parent == tmp_path / wal_repair.QUARANTINE
    assert sorted(p.name for p in quarantine.iterdir()) == [
        f"{g:012d}.wal" for g in damage.cut_segments
    ]
    np.testing.assert_allclose(client.pull("emb", KEYS), updates.after(kept), rtol=1e-6)
    emb = [t for t in client.call("ListTables", ps_pb2.ListTablesRequest()).tables
           if t.table == "emb"]  # fmt: skip
    (condition,) = emb[0].conditions
    assert condition.reason == "AcceptedLogLoss" and f"replayed {kept} log records" in (
        condition.message
    )
    client.update("emb", [5], np.ones((1, 8), np.float32))  # served, and its writes logged
    _, again = start("wal")  # the cut log replays exactly the prefix, then the new write
    oracle = updates.table_after(kept)
    oracle.update(np.array([5]), np.ones((1, 8), np.float32))
    np.testing.assert_allclose(again.pull("emb", KEYS), oracle.pull(KEYS), rtol=1e-6)
    assert conditions_of(again, "emb") == []


def conditions_of(client: Client, table: str) -> list[Any]:
    listed = client.call("ListTables", ps_pb2.ListTablesRequest()).tables
    return next(list(t.conditions) for t in listed if t.table == table)


def test_a_last_write_that_never_reached_the_disk_leaves_every_update_before_it_served(
    tmp_path: Path, start: Any
) -> None:
    updates = three_segments(start)
    path = segment_path(log_dir(tmp_path), 2)
    last, end = offsets(path)[-1], len(path.read_bytes().rstrip(b"\0"))
    with open(path, "r+b") as handle:  # its sectors never written: zeros, as created
        handle.seek(last)
        handle.write(bytes(end - last))
    handle_, client = start("wal")
    np.testing.assert_allclose(client.pull("emb", KEYS), updates.after(299), rtol=1e-6)
    registry = handle_.server.metrics.registry
    assert registry.get_sample_value("recstore_ps_wal_damaged_total", {"table": "emb"}) is None


# -- kill -9, then the operator's command -------------------------------------------------
def scrape(node: Any) -> dict[str, float]:
    (serving,) = [json.loads(line) for line in node.log if '"ps node serving"' in line]
    url = f"http://127.0.0.1:{serving['metrics_port']}/metrics"
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


@pytest.mark.slow
def test_kill9_then_one_bit_flipped_refuses_until_recstore_recover_accepts_the_loss(
    tmp_path: Path, spawn: Any
) -> None:
    node = spawn(tmp_path, "--durability", "wal", "--metrics-port", "0")
    client = Client(node.address)
    client.create(table_spec())
    client.create(spec("other", initializer={"kind": "zeros"}))
    updates = Updates()
    updates.send(client, 0, 300)  # 300 acknowledged single-key updates, one segment
    client.push("other", [7], np.full((1, 8), 7.0, np.float32))
    node.kill()
    path = segment_path(log_dir(tmp_path), 0)
    record_100 = offsets(path)[101]  # after the segment's window record
    data = bytearray(path.read_bytes())
    data[record_100 + 60] ^= 0x01  # one bit, inside record 100; 199 intact records follow
    path.write_bytes(bytes(data))

    restarted = spawn(tmp_path, "--durability", "wal", "--metrics-port", "0")
    again = Client(restarted.address)
    with pytest.raises(grpc.RpcError) as refused:
        again.pull("emb", KEYS)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (f"segment 000000000000.wal, offset {record_100}: checksum mismatch; 199 intact "
            "records follow it") in refused.value.details()  # fmt: skip
    np.testing.assert_array_equal(again.find("other", [7])[0][0], np.full(8, 7.0))
    metrics = scrape(restarted)
    assert metrics['recstore_ps_wal_damaged_total{table="emb"}'] == 1
    assert metrics['recstore_ps_table_unrecoverable{table="emb"}'] == 1
    assert 'recstore_ps_wal_damaged_total{table="other"}' not in metrics

    result = CliRunner().invoke(
        app, ["recover", "emb", "--accept-log-loss", "--endpoint", restarted.address]
    )
    assert result.exit_code == 0, result.output
    (shard,) = json.loads(result.output)["shards"]
    assert shard["outcome"] == "recovered" and shard["replayed_records"] == 100
    assert shard["writes_dropped"] == 199
    written = len(data.rstrip(b"\0"))  # the segment's bytes before its unwritten rest
    assert shard["dropped"] == [
        {"generation": 0, "offset": record_100, "bytes": written - record_100, "writes": 199}
    ]
    assert f"offset {record_100}: checksum mismatch" in shard["damage"]
    np.testing.assert_allclose(again.pull("emb", KEYS), updates.after(100), rtol=1e-6)
    said = restarted.wait_for(
        "table served without what followed damage in its log, as the operator accepted", 30
    )
    assert said["level"] == "error"
    assert said["table"] == "emb" and "dropped 199 intact writes" in said["loss"]


def test_recstore_recover_asks_the_tables_nodes_and_writes_the_audit_log(
    tmp_path: Path, start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recstore.cli import recover as command

    three_segments(start)
    bad_magic(log_dir(tmp_path))
    handle, client = start("wal")
    asked: list[tuple[str, str, Any]] = []

    class Admin:  # the admin API: discovery names the node, the report goes to the audit log
        def __init__(self, url: str, token: str | None, **_: Any) -> None:
            assert (url, token) == ("http://admin:8080", "editor-token")

        def get(self, path: str) -> Any:
            asked.append(("GET", path, None))
            return {"endpoints": [handle.address]}

        def request(self, method: str, path: str, json: Any = None) -> Any:
            asked.append((method, path, json))

        def close(self) -> None:
            pass

    monkeypatch.setattr(command, "AdminClient", Admin)
    args = ["recover", "emb", "--admin-url", "http://admin:8080", "--token", "editor-token",
            "--state-dir", str(tmp_path / "state")]  # fmt: skip
    refused = CliRunner().invoke(app, args)  # not accepting the loss: still refused
    assert refused.exit_code == 1
    assert "did not recover 'emb'" in refused.output and "bad segment magic" in refused.output
    accepted = CliRunner().invoke(app, [*args, "--accept-log-loss"])
    assert accepted.exit_code == 0, accepted.output
    posts = [body for method, path, body in asked if method == "POST"]
    assert [p for m, p, _ in asked if m == "POST"] == ["/tables/emb/recoveries"] * 2
    assert [s["outcome"] for s in posts[0]["shards"]] == ["failed"]
    (shard,) = posts[1]["shards"]
    assert posts[1]["accept_log_loss"] is True and shard["outcome"] == "recovered"
    assert shard["endpoint"] == handle.address and shard["writes_dropped"] == 200
    client.pull("emb", KEYS)  # served
    again = CliRunner().invoke(app, [*args, "--accept-log-loss"])  # served already: a no-op
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["shards"][0]["how"] == "served already: nothing to recover"


def test_the_refusal_reaches_the_tables_status_through_the_local_provisioner(
    tmp_path: Path, start: Any
) -> None:
    from recstore.local import table_status
    from recstore.local.shard_client import ShardClient
    from recstore.local.table import LocalTable

    three_segments(start)
    flip_record(log_dir(tmp_path))
    handle, _ = start("wal")
    statuses: list[dict[str, Any]] = []

    class Reporter:
        def register_node(self, table: str, shard: int, endpoint: str, metrics: str) -> int:
            return 1

        def heartbeat(self, node_id: int, ready: bool, rows: int, memory_bytes: int) -> None:
            pass

        def report_status(self, table: str, status: dict[str, Any]) -> None:
            statuses.append(status)

    node = ShardClient(handle.address, timeout=30)
    table = LocalTable(table_spec(), tmp_path / "local", [(handle.port, 0)], [node], [None])
    table_status.report(table, Reporter(), now=0.0)  # type: ignore[arg-type]
    node.close()
    status = statuses[-1]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert status["phase"] == "Failed"
    assert (ready["status"], ready["reason"]) == ("False", "NodeRefused")
    assert "segment 000000000001.wal, offset" in ready["message"]
    assert "checksum mismatch; 49 intact records follow it" in ready["message"]
    assert "recstore recover emb --accept-log-loss" in ready["message"]
