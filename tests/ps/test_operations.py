"""Concurrent clients, Prometheus metrics, the command line and periodic checkpoints."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from recstore.ps.serve.server import ServerHandle, start_in_thread

from .conftest import Client, spec


def test_concurrent_clients(client: Client, node: ServerHandle) -> None:
    client.create(spec(initializer={"kind": "zeros"}, optimizer={"kind": "sgd", "lr": 1.0}))
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            c = Client(node.address)
            own = np.arange(10) + 100 * index
            for round_ in range(10):
                c.push("emb", own, np.full((10, 8), round_, np.float32))
                c.update("emb", [999], np.full((1, 8), 0.5, np.float32))  # shared row, exact sums
                assert (c.pull("emb", own) == round_).all()
            c.close()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    np.testing.assert_array_equal(client.pull("emb", [999]), np.full((1, 8), -0.5 * 60))
    for i in range(6):
        np.testing.assert_array_equal(
            client.pull("emb", np.arange(10) + 100 * i), np.full((10, 8), 9)
        )


def test_metrics_endpoint(tmp_path: Path) -> None:
    handle = start_in_thread(data_dir=tmp_path, metrics_port=0)
    try:
        client = Client(handle.address)
        client.create(spec())
        client.pull("emb", np.arange(7))
        with pytest.raises(Exception):  # noqa: B017 - any RpcError
            client.pull("missing", [1])
        url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'recstore_ps_requests_total{code="OK",method="Pull"} 1.0' in body
        assert 'recstore_ps_requests_total{code="NOT_FOUND",method="Pull"} 1.0' in body
        assert 'recstore_ps_rows_total{method="Pull",table="emb"} 7.0' in body
        assert 'recstore_ps_table_rows{table="emb"} 7.0' in body
        assert "recstore_ps_request_seconds_bucket" in body
        assert "process_resident_memory_bytes" in body
    finally:
        handle.stop(final_checkpoint=False)


def test_periodic_checkpoints(tmp_path: Path) -> None:
    handle = start_in_thread(data_dir=tmp_path, checkpoint_interval=0.2, keep_checkpoints=2)
    try:
        client = Client(handle.address)
        client.create(spec())
        client.push("emb", [1], np.ones((1, 8), np.float32))
        deadline = time.monotonic() + 30
        names: list[str] = []
        while time.monotonic() < deadline and len(names) < 2:
            names = sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt-*"))
        assert len(names) == 2  # kept: the newest two
    finally:
        handle.stop(final_checkpoint=False)


def test_command_line_validates_flags() -> None:
    import typer

    from recstore.cli.ps_node import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    runner = CliRunner(env={"COLUMNS": "240", "TERMINAL_WIDTH": "240", "NO_COLOR": "1"})
    help_text = runner.invoke(app, ["ps-node", "--help"]).output
    for flag in (
        "--shard-index",
        "--num-shards",
        "--durability",
        "--auth-token-file",
        "--read-only-token-file",
        "--metrics-port",
    ):
        assert flag in help_text
    bad = runner.invoke(app, ["ps-node", "--data-dir", "/tmp/x", "--read-only-token-file", "/t"])
    assert bad.exit_code != 0 and "needs --auth-token-file" in bad.output
    bad = runner.invoke(app, ["ps-node", "--data-dir", "/tmp/x", "--durability", "maybe"])
    assert bad.exit_code != 0 and "checkpoint or wal" in bad.output
    bad = runner.invoke(
        app, ["ps-node", "--data-dir", "/tmp/x", "--shard-index", "2", "--num-shards", "2"]
    )
    assert bad.exit_code != 0


#: 127.0.0.1 in /proc/net/tcp, and as the IPv4-mapped ::ffff:127.0.0.1 or ::1 in tcp6
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def _listening(pid: int, port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp) that process ``pid`` listens on at ``port``."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_a_node_listens_on_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    node = subprocess.Popen(
        [sys.executable, "-m", "recstore", "ps-node", "--port", "0", "--data-dir", str(tmp_path)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert node.stderr is not None
        for line in node.stderr:
            if '"ps node serving"' in line:
                port = int(json.loads(line)["port"])
                break
        else:
            raise AssertionError(f"node exited with {node.wait()}")
        addresses = _listening(node.pid, port)
        assert addresses and addresses <= LOOPBACK, addresses
    finally:
        node.kill()
        node.wait()
