"""Real node processes: kill -9, restart, SIGTERM; checkpoint and WAL guarantees."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recstore.store import Table

from .conftest import Client, spec

pytestmark = pytest.mark.slow

KEYS = np.arange(200)


def table_spec() -> Any:
    return spec(optimizer={"kind": "adam", "lr": 0.05})


def test_kill9_restores_last_checkpoint(tmp_path: Path, spawn: Any) -> None:
    node = spawn(tmp_path)
    client = Client(node.address)
    client.create(table_spec())
    client.push("emb", KEYS, np.full((200, 8), 1.5, np.float32))
    client.update("emb", KEYS[:50], np.ones((50, 8), np.float32))
    expected = client.pull("emb", KEYS)
    client.save()
    client.push("emb", KEYS, np.zeros((200, 8), np.float32))  # lost: after the checkpoint
    client.update("emb", KEYS, np.ones((200, 8), np.float32))
    node.kill()
    restarted = Client(spawn(tmp_path).address)
    np.testing.assert_array_equal(restarted.pull("emb", KEYS), expected)
    # the optimizer state (adam moments and step) came back too: the next update agrees
    oracle = Table(table_spec())
    oracle.push(KEYS, np.full((200, 8), 1.5, np.float32))
    oracle.update(KEYS[:50], np.ones((50, 8), np.float32))
    restarted.update("emb", KEYS, np.ones((200, 8), np.float32))
    oracle.update(KEYS, np.ones((200, 8), np.float32))
    np.testing.assert_allclose(restarted.pull("emb", KEYS), oracle.pull(KEYS), rtol=1e-6)


def test_wal_keeps_every_acknowledged_write(tmp_path: Path, spawn: Any) -> None:
    node = spawn(tmp_path, "--durability", "wal")
    client = Client(node.address)
    client.create(table_spec())
    client.create(spec("other", initializer={"kind": "zeros"}))
    oracle = Table(table_spec())
    rng = np.random.default_rng(1)
    client.push("emb", KEYS, np.full((200, 8), 1.0, np.float32))
    oracle.push(KEYS, np.full((200, 8), 1.0, np.float32))
    client.save()  # the log then starts over from this checkpoint
    for _ in range(20):
        keys = rng.integers(0, 200, 32)
        grads = rng.standard_normal((32, 8)).astype(np.float32)
        client.update("emb", keys, grads)
        oracle.update(keys, grads)
    values = rng.standard_normal((10, 8)).astype(np.float32)
    client.push("emb", KEYS[:10], values)
    oracle.push(KEYS[:10], values)

    # concurrent writers to another table: every acknowledged push must survive
    acknowledged: list[int] = []

    def writer(base: int) -> None:
        c = Client(node.address)
        for i in range(10):
            c.push("other", [base + i], np.full((1, 8), base + i, np.float32))
            acknowledged.append(base + i)

    threads = [threading.Thread(target=writer, args=(100 * t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    node.kill()
    restarted = Client(spawn(tmp_path, "--durability", "wal").address)
    np.testing.assert_allclose(restarted.pull("emb", KEYS), oracle.pull(KEYS), rtol=1e-6)
    got, found = restarted.find("other", acknowledged)
    assert found.all()
    np.testing.assert_array_equal(got[:, 0], acknowledged)


def test_wal_keeps_every_acknowledged_multi_update(tmp_path: Path, spawn: Any) -> None:
    import grpc

    from recstore.core.wire import WireClient

    node = spawn(tmp_path, "--durability", "wal")
    client = Client(node.address)
    specs = {"emb": table_spec(), "other": spec("other", optimizer={"kind": "adagrad", "lr": 0.1})}
    oracles = {name: Table(s) for name, s in specs.items()}
    for s in specs.values():
        client.create(s)
    client.save()  # the log starts over from here: replay must bring back every multi-update
    rng = np.random.default_rng(2)
    with grpc.insecure_channel(node.address) as channel:
        fast = WireClient(channel, timeout=60)
        for step in range(15):
            items = []
            for name in ("emb", "other", "emb"):
                keys = rng.integers(0, 200, 16)
                items.append((name, keys, rng.standard_normal((16, 8)).astype(np.float32)))
            assert fast.multi_update(items, lr=0.01 * (step + 1)) == [16, 16, 16]
            for name, keys, grads in items:
                oracles[name].update(keys, grads, 0.01 * (step + 1))
    node.kill()
    restarted = Client(spawn(tmp_path, "--durability", "wal").address)
    for name, oracle in oracles.items():
        np.testing.assert_allclose(restarted.pull(name, KEYS), oracle.pull(KEYS), rtol=1e-6)


def test_save_killed_midway_leaves_previous_checkpoint(tmp_path: Path, spawn: Any) -> None:
    node = spawn(tmp_path)
    client = Client(node.address)
    client.create(spec(num_embeddings=300_000, embedding_dim=64, initializer={"kind": "zeros"}))
    rows = np.arange(300_000)
    client.push("emb", rows[:10], np.full((10, 64), 7.0, np.float32))
    client.save("good")
    client.push("emb", rows, np.ones((300_000, 64), np.float32))
    checkpoints = tmp_path / "checkpoints"
    saver = threading.Thread(target=lambda: _ignore_errors(lambda: client.save("doomed")))
    saver.start()
    deadline = time.monotonic() + 30
    caught_midway = False
    while time.monotonic() < deadline and not (checkpoints / "doomed").exists():
        if any(p.name.startswith(".tmp-doomed") for p in checkpoints.iterdir()):
            caught_midway = True
            break
        time.sleep(0.001)
    node.kill()
    saver.join()
    assert caught_midway, "the save finished before the kill: nothing was interrupted"
    restarted = Client(spawn(tmp_path).address)
    # The rename may still have won the race in the last microseconds: then the
    # new checkpoint is complete and must load whole.
    expected = 1.0 if (checkpoints / "doomed").exists() else 7.0
    np.testing.assert_array_equal(restarted.pull("emb", rows[:10]), np.full((10, 64), expected))
    assert not any(p.name.startswith(".tmp-") for p in checkpoints.iterdir())


def _ignore_errors(call: Any) -> None:
    with contextlib.suppress(Exception):  # the node dies under the call
        call()


def test_sigterm_drains_and_writes_final_checkpoint(tmp_path: Path, spawn: Any) -> None:
    node = spawn(tmp_path)
    client = Client(node.address)
    client.create(spec())
    client.push("emb", KEYS, np.full((200, 8), 4.0, np.float32))
    assert node.terminate() == 0
    assert any(line for line in node.log if "final checkpoint written" in line) or _drain(node)
    restarted = Client(spawn(tmp_path).address)
    np.testing.assert_array_equal(restarted.pull("emb", KEYS), np.full((200, 8), 4.0))


def _drain(node: Any) -> bool:
    node.wait_for("final checkpoint written", 10)
    return True


def test_wal_replays_16_bit_gradients_of_a_float32_table(tmp_path: Path, spawn: Any) -> None:
    """16-bit transport: the log keeps the gradients as they came, replay widens them alike."""
    import grpc

    from recstore.core.wire import WireClient

    node = spawn(tmp_path, "--durability", "wal")
    client = Client(node.address)
    client.create(table_spec())
    client.save()
    oracle = Table(table_spec())
    rng = np.random.default_rng(4)
    with grpc.insecure_channel(node.address) as channel:
        fast = WireClient(channel, timeout=60)
        for step in range(6):
            keys = rng.integers(0, 200, 16)
            grads = rng.standard_normal((16, 8)).astype(np.float32)
            narrow = grads.astype(np.float16) if step % 2 else _bfloat16_bits(grads)
            if step % 3:
                assert fast.update("emb", keys, narrow) == 16
            else:
                assert fast.multi_update([("emb", keys, narrow)]) == [16]
            oracle.update(keys, narrow)
    node.kill()
    restarted = Client(spawn(tmp_path, "--durability", "wal").address)
    np.testing.assert_array_equal(restarted.pull("emb", KEYS), oracle.pull(KEYS))


def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(values).to(torch.bfloat16).view(torch.uint16).numpy()
