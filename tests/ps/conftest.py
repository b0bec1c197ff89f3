"""Fixtures for PS-node tests: in-process nodes, subprocess nodes, typed RPC helpers."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core import TableSpec
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.v1 import ps_pb2, ps_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def spec(name: str = "emb", **fields: Any) -> TableSpec:
    base: dict[str, Any] = {"name": name, "num_embeddings": 1000, "embedding_dim": 8}
    return TableSpec.model_validate(base | fields)


class Client:
    """Typed helpers over the generated stub (numpy in, numpy out)."""

    def __init__(self, address: str, token: str | None = None) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = ps_pb2_grpc.ParameterServerStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def call(self, method: str, request: Any) -> Any:
        return getattr(self.stub, method)(request, metadata=self.metadata, timeout=60)

    def create(self, table: TableSpec) -> Any:
        return self.call(
            "CreateTable", ps_pb2.CreateTableRequest(spec_json=json.dumps(table.to_wire()))
        )

    def pull(self, table: str, keys: Any, dtype: str = "<f4") -> np.ndarray:
        reply = self.call("Pull", ps_pb2.PullRequest(table=table, keys=_keys(keys)))
        return np.frombuffer(reply.values, dtype).reshape(len(_keys(keys)) // 8, reply.dim)

    def find(self, table: str, keys: Any) -> tuple[np.ndarray, np.ndarray]:
        reply = self.call("Pull", ps_pb2.PullRequest(table=table, keys=_keys(keys), read_only=True))
        values = np.frombuffer(reply.values, "<f4").reshape(-1, reply.dim)
        return values, np.frombuffer(reply.found, np.uint8).astype(bool)

    def push(self, table: str, keys: Any, values: np.ndarray) -> Any:
        request = ps_pb2.PushRequest(table=table, keys=_keys(keys), values=values.tobytes())
        return self.call("Push", request)

    def update(self, table: str, keys: Any, grads: np.ndarray, lr: float | None = None) -> Any:
        request = ps_pb2.UpdateRequest(table=table, keys=_keys(keys), grads=grads.tobytes())
        if lr is not None:
            request.lr = lr
        return self.call("Update", request)

    def save(self, checkpoint_id: str = "") -> Any:
        return self.call("Save", ps_pb2.SaveRequest(checkpoint_id=checkpoint_id)).checkpoint

    def names(self) -> list[str]:
        return list(self.call("ListTables", ps_pb2.ListTablesRequest()).names)

    def close(self) -> None:
        self.channel.close()


def _keys(keys: Any) -> bytes:
    return keys if isinstance(keys, bytes) else np.asarray(keys, dtype="<i8").tobytes()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_in_thread(data_dir=tmp_path / "node")
    yield handle
    handle.stop(final_checkpoint=False)


@pytest.fixture
def client(node: ServerHandle) -> Iterator[Client]:
    c = Client(node.address)
    yield c
    c.close()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """``start(durability, **options)``: a node on ``tmp_path`` in this process (the one
    running before is stopped as a crash would stop it: no checkpoint on the way out)."""
    running: list[ServerHandle] = []

    def run(durability: str = "checkpoint", **options: Any) -> tuple[ServerHandle, Client]:
        for handle in running:
            handle.stop(final_checkpoint=False)
        running.clear()
        handle = start_in_thread(data_dir=tmp_path, durability=durability, **options)
        running.append(handle)
        return handle, Client(handle.address)

    yield run
    for handle in running:
        handle.stop(final_checkpoint=False)


class NodeProcess:
    """``python -m recstore.ps`` in a subprocess; its port is read from its start-up log."""

    def __init__(self, data_dir: Path, *args: str, timeout: float = 60.0) -> None:
        command = [
            sys.executable,
            "-m",
            "recstore.ps",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            *args,
        ]
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        event = self.wait_for("ps node serving", timeout)
        self.port = int(event["port"])
        self.address = f"127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line)

    def wait_for(self, message: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.log.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("msg") == message:
                return event
        self.kill()
        raise AssertionError(f"no {message!r} in time; log:\n{''.join(self.log)}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self, timeout: float = 60.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)


@pytest.fixture
def spawn() -> Iterator[Any]:
    started: list[NodeProcess] = []

    def start(data_dir: Path, *args: str) -> NodeProcess:
        process = NodeProcess(data_dir, *args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


MountTmpfs = Callable[[Path, str], None]


@pytest.fixture
def mounts() -> Iterator[MountTmpfs]:
    """Mount a tmpfs (``mounts(path, "size=1m")``), unmounted after the test.

    Needs root: elsewhere the test is skipped, saying why; in CI (``CI`` set), where
    the tests run as root on machines that allow it, it fails instead.
    """
    made: list[Path] = []

    def mount(mount_point: Path, options: str) -> None:
        mount_point.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            why = f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}"
            if os.environ.get("CI"):
                pytest.fail(why)
            pytest.skip(why)
        made.append(mount_point)

    yield mount
    for mount_point in reversed(made):
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
