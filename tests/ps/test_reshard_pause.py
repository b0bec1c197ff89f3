"""What a batch's write pause waits for, and which work runs at a lower CPU priority.

A source's held writes are refused as soon as the committed map is installed,
not after its fsyncs; a source killed before that map is durable comes back
sealed at the old map. The copy before the seal (snapshot pages, catch-up
rounds, their imports) runs on background threads, the seal and the tail at
the normal priority. Requests run on threads and synchronise on events.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recstore.core import SlotMap, WrongShard, slot_of
from recstore.core.background import BACKGROUND_NICE, lower_this_thread
from recstore.core.reshard.plan import ReshardJob, SlotBatch, moved
from recstore.ps.checkpoint import recovery
from recstore.ps.node import Node
from recstore.ps.reshard import steps as reshard_steps

from .conftest import spec
from .test_reshard_online import Fleet, Trainer

DIM = 4
KEYS = np.arange(2000, dtype=np.int64)
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node, SlotBatch]]:
    """Shard 0 of 2 (the source, sealed) and shard 1 of 2 (the target, importing)."""
    table = spec("t", num_embeddings=len(KEYS), embedding_dim=DIM, shards=2,
                 optimizer={"kind": "sgd", "lr": 1.0})  # fmt: skip
    nodes = [Node(tmp_path / f"n{i}", shard_index=i, num_shards=2) for i in range(2)]
    for node in nodes:
        node.create_table(table, SlotMap.initial(2))
    batch = SlotBatch(0, 1, ((0, 1000),))
    reshard_steps.begin_import(nodes[1], "t", list(batch.ranges))
    reshard_steps.begin_outgoing(nodes[0], "t", list(batch.ranges), batch.target)
    reshard_steps.seal(nodes[0], "t", timeout=5)
    yield nodes[0], nodes[1], batch


def _held_write(node: Node, key: np.ndarray) -> tuple[threading.Thread, list[BaseException]]:
    """A write to a sealed key, started on a thread (it waits on the seal)."""
    outcome: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            node.update("t", key.tobytes(), np.ones((1, DIM), np.float32).tobytes(),
                        "float32", DIM, None)  # fmt: skip
        except BaseException as error:
            outcome.append(error)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    return writer, outcome


def test_held_writes_are_refused_before_the_sources_map_is_durable(pair, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    source, target, batch = pair
    key = KEYS[batch.mask()[slot_of(KEYS)]][:1]
    committed = moved(SlotMap.initial(2), batch)
    assert reshard_steps.set_slot_map(target, "t", 1, committed)
    writer, outcome = _held_write(source, key)
    saving, durable = threading.Event(), threading.Event()
    save = source.save_catalogue

    def slow_save(*pending: Any) -> None:  # the fsyncs of the catalogue, held open by the test
        saving.set()
        durable.wait()
        save(*pending)

    monkeypatch.setattr(source, "save_catalogue", slow_save)
    install = (source, "t", 1, committed)
    installer = threading.Thread(target=reshard_steps.set_slot_map, args=install)
    installer.start()
    assert saving.wait(60)
    writer.join(timeout=60)  # refused while the catalogue is still being written
    released = not writer.is_alive()
    durable.set()
    installer.join()
    writer.join()
    assert released, "the held write waited for the source's catalogue fsync"
    assert isinstance(outcome[0], WrongShard) and outcome[0].epoch == 2


def test_a_source_killed_before_its_new_map_is_durable_comes_back_sealed(pair, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    source, target, batch = pair
    committed = moved(SlotMap.initial(2), batch)
    assert reshard_steps.set_slot_map(target, "t", 1, committed)

    def killed(*pending: Any) -> None:
        raise OSError("killed before the catalogue reached the disk")

    monkeypatch.setattr(source, "save_catalogue", killed)
    with pytest.raises(OSError, match="killed"):
        reshard_steps.set_slot_map(source, "t", 1, committed)
    restarted = Node(source.data_dir, shard_index=0, num_shards=2)
    recovery.recover(restarted)
    assert restarted.get("t").entry.slot_map.epoch == 1
    out = restarted.reshards.outgoing["t"]
    assert out.sealed and np.array_equal(out.slots, batch.mask())
    assert reshard_steps.set_slot_map(restarted, "t", 1, committed)  # the resumed commit
    assert not restarted.reshards.tracks("t")


@linux_only
def test_a_background_thread_runs_at_the_background_nice() -> None:
    caller = _nice()
    seen: list[int] = []
    thread = threading.Thread(target=lambda: (lower_this_thread(), seen.append(_nice())))
    thread.start()
    thread.join()
    assert seen == [max(BACKGROUND_NICE, caller)]
    assert _nice() == caller  # only the thread that asked is lowered


@linux_only
def test_the_copy_runs_below_the_normal_priority_and_the_pause_at_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    normal = _nice()
    if normal >= BACKGROUND_NICE:
        pytest.skip("the tests already run at the background priority")
    seen: dict[str, set[int]] = {}

    def watched(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            what = name
            if name == "import_rows":
                rows = args[2]
                what = "import tail" if rows.present is not None else "import copy"
            seen.setdefault(what, set()).add(_nice())
            return fn(*args, **kwargs)

        return call

    for name in ("snapshot_page", "import_rows", "seal", "activate"):
        monkeypatch.setattr(reshard_steps, name, watched(name, getattr(reshard_steps, name)))
    fleet = Fleet(tmp_path, 3, 2)
    try:
        trainer = Trainer(fleet.endpoints, fleet.spec.name)
        rng = np.random.default_rng(3)
        for _ in range(3):
            trainer.step(rng)
        runner_steps: dict[str, int] = {}

        def on_step(step: str, job: ReshardJob) -> None:
            runner_steps.setdefault(step, _nice())

        job = ReshardJob.start(fleet.spec.name, fleet.store.slot_map(), 3, batch_slots=4000)
        fleet.run(3, on_step=on_step).run(job)
        trainer.check()
    finally:
        fleet.stop()
    # the nodes: the copy on background threads, the seal, tail and activation not
    assert seen["snapshot_page"] == {BACKGROUND_NICE}
    assert seen["import copy"] == {BACKGROUND_NICE}
    assert seen["seal"] == seen["import tail"] == seen["activate"] == {normal}
    # the runner: its copy too, while the steps of the pause run at the caller's priority
    assert runner_steps["snapshot"] == runner_steps["catch-up"] == BACKGROUND_NICE
    assert runner_steps["seal"] == runner_steps["commit"] == normal


_POOL_PROBE = """
import os, threading
import numpy as np
from recstore import _native
from recstore.core import TableSpec
from recstore.core.background import lower_this_thread
from recstore.store import Table

if os.environ.get("START_WORKERS") == "1":
    _native.start_workers()  # what a node's servicer does before its background threads run
table = Table(TableSpec(name="t", num_embeddings=1 << 16, embedding_dim=4))

done, leave, mine = threading.Event(), threading.Event(), []

def copy():  # a background copy thread's first parallel work in this process
    lower_this_thread()
    table.native_slot_checksums(np.ones(16384, dtype=bool))
    mine.append(threading.get_native_id())
    done.set()
    leave.wait()

worker = threading.Thread(target=copy)
worker.start()
done.wait()
nices = [int(open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()[16])
         for t in os.listdir("/proc/self/task") if int(t) != mine[0]]
leave.set()
print(max(nices))
"""


@linux_only
def test_the_engines_workers_keep_the_normal_priority_when_a_copy_thread_comes_first(
    tmp_path: Path,
) -> None:
    def most_lowered(start_workers: str) -> int:
        env = os.environ | {"START_WORKERS": start_workers}
        out = subprocess.run([sys.executable, "-c", _POOL_PROBE], env=env, check=True,
                             capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
        return int(out.stdout.split()[-1])

    normal = _nice()
    if os.cpu_count() == 1 or normal >= BACKGROUND_NICE:
        pytest.skip("needs two cores and a normal priority")
    assert most_lowered("0") == BACKGROUND_NICE  # the hazard: helpers born lowered
    assert most_lowered("1") == normal


def test_the_seal_record_reaches_the_disk_while_the_tail_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = spec("t", num_embeddings=len(KEYS), embedding_dim=DIM, shards=2)
    source = Node(tmp_path / "n0", shard_index=0, num_shards=2)
    source.create_table(table, SlotMap.initial(2))
    reshard_steps.begin_outgoing(source, "t", [(0, 1000)], 1)
    recording = threading.Event()
    remember, rows_of = reshard_steps.held_slots.remember, reshard_steps.rows_of
    overlapped: list[bool] = []

    def slow_record(*args: Any) -> None:
        recording.set()
        remember(*args)

    def read_rows(*args: Any) -> Any:  # the tail is read while the seal's record is written
        overlapped.append(recording.wait(60))
        return rows_of(*args)

    monkeypatch.setattr(reshard_steps.held_slots, "remember", slow_record)
    monkeypatch.setattr(reshard_steps, "rows_of", read_rows)
    reshard_steps.seal(source, "t", timeout=5)
    assert overlapped == [True]
    restarted = Node(source.data_dir, shard_index=0, num_shards=2)
    recovery.recover(restarted)
    assert restarted.reshards.outgoing["t"].sealed  # and it was on disk before the reply
