"""Online resharding 2 -> 3 -> 2 while a trainer runs, against a checkpoint save + load.

Laid out as the local platform runs it: every PS node is its own process
(``python -m recstore.ps`` on loopback; two sized for 2 shards, one for 3),
the reshard runner is a separate process (the provisioner's), and the
trainer runs in this process. A table of ``--rows`` x ``--dim`` (adam, so
optimizer state moves too) is filled, the trainer updates random rows
through the SDK, and ``recstore.core.reshard.protocol`` moves the table to 3
shards and back. Reported: each move's time and rows/s, the write pause per
slot batch (p50/p99: from the seal call until the source's reply to the new
map, and as the source measures it, until its held writes are refused), the trainer's
step time before / during / after, and, as the baseline in the same run, a
checkpoint Save + Load of the same rows on every node (rows/s).
Prints a table and writes bench/results/reshard_bench.json.

Usage: python bench/reshard_bench.py [--rows 500000] [--dim 64] [--batch-slots 1024]
                                     [--copy-rate BYTES_PER_S]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import multiprocessing
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recstore import RecStoreClient
from recstore.core import SlotMap, TableSpec
from recstore.core.control import ControlClient, create_table_rpc, load_rpc, save_rpc
from recstore.core.reshard.plan import ReshardJob
from recstore.core.reshard.protocol import ReshardRun
from recstore.local.reshard_store import FileJobStore

ROOT = Path(__file__).resolve().parent.parent
STEP_TIMEOUT_S = 600.0
#: the runner's steps inside the write pause (each timed until the next step starts)
PAUSE_STEPS = ("seal", "tail", "verify", "commit", "activate")


class NodeProcess:
    """One PS node process on loopback; its port is read from its start-up log line."""

    def __init__(self, data_dir: Path, shard_index: int, num_shards: int) -> None:
        command = [
            sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", "0",
            "--data-dir", str(data_dir), "--shard-index", str(shard_index),
            "--num-shards", str(num_shards),
        ]  # fmt: skip
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
        )
        assert self.process.stderr is not None
        for line in self.process.stderr:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("msg") == "ps node serving":
                self.address = f"127.0.0.1:{int(event['port'])}"
                break
        else:
            raise RuntimeError(f"node {shard_index} exited before serving")
        # keep draining its log so the node never blocks on a full pipe
        threading.Thread(target=self.process.stderr.read, daemon=True).start()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def run_reshards(
    endpoints: list[str], job_path: str, batch_slots: int, copy_rate: float, out: Any
) -> None:
    """The provisioner's side, in its own process: 2 -> 3 -> 2, one result per move."""
    clients = [ControlClient(e, timeout=STEP_TIMEOUT_S) for e in endpoints]
    store = FileJobStore(Path(job_path), SlotMap.initial(2))
    steps: dict[str, list[float]] = {}
    last: list[tuple[str, float]] = []
    timeline: list[tuple[str, float]] = []  # (step, start): where the trainer's time goes

    def on_step(step: str, job: ReshardJob) -> None:
        now = time.monotonic()
        if last and last[0][0] in PAUSE_STEPS:
            steps.setdefault(last[0][0], []).append(now - last[0][1])
        last[:] = [(step, now)]
        timeline.append((step, now))

    for shards in (3, 2):
        run = ReshardRun("bench", clients, store, on_step=on_step, copy_rate=copy_rate)
        begin = time.monotonic()
        job = run.run(ReshardJob.start("bench", store.slot_map(), shards, batch_slots))
        end = time.monotonic()
        moved = int(sum(r.seal_checksums.rows.sum() for r in run.records))
        pauses = sorted(r.pause_s for r in run.records)
        held = sorted(r.held_s for r in run.records)
        out.put({
            "to_shards": shards, "seconds": end - begin, "rows": moved,
            "rows_per_s": moved / (end - begin), "bytes": job.bytes_moved,
            "batches": len(job.batches),
            "pause_p50_ms": 1e3 * statistics.median(pauses),
            "pause_p99_ms": 1e3 * float(np.percentile(pauses, 99)),
            "pauses_ms": [1e3 * p for p in pauses], "begin": begin, "end": end,
            "held_p50_ms": 1e3 * statistics.median(held),
            "held_p99_ms": 1e3 * float(np.percentile(held, 99)),
            "pause_steps_median_ms": {
                k: 1e3 * statistics.median(v) for k, v in steps.items()
            },
            "timeline": list(timeline),
        })  # fmt: skip
        steps.clear()
        timeline.clear()
    for client in clients:
        client.close()


class Trainer:
    """Steps of 256 random rows (update, then a pull that waits for it), timed."""

    def __init__(self, endpoints: list[str], rows: int, dim: int) -> None:
        self.client = RecStoreClient(role="reshard-bench")
        self.client.set_ps_endpoints(endpoints)
        self.client.init_data("bench", (rows, dim), torch.float32, optimizer={"kind": "adam"})
        self.rows, self.dim = rows, dim
        self.times: list[tuple[float, float]] = []  # (end, seconds)
        self.rng = np.random.default_rng(0)

    def step(self) -> None:
        ids = torch.from_numpy(self.rng.integers(0, self.rows, 256))
        started = time.monotonic()
        self.client.update("bench", ids, torch.randn(256, self.dim))
        self.client.pull("bench", ids[:8])
        now = time.monotonic()
        self.times.append((now, now - started))

    def steps_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.step()

    def median_between(self, start: float, end: float) -> float:
        inside = [s for t, s in self.times if start <= t <= end]
        return statistics.median(inside) if inside else float("nan")

    def by_step(self, moves: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
        """Per move step: the trainer's steps that started in it (count, summed seconds)."""
        marks = sorted((t, step) for m in moves for step, t in m["timeline"])
        marks += [(m["end"], "between") for m in moves]
        marks.sort()
        out: dict[str, tuple[int, float]] = {}
        first, last = moves[0]["begin"], moves[-1]["end"]
        for end, seconds in self.times:
            start = end - seconds
            if first <= start <= last:
                at = max(0, bisect.bisect_right(marks, (start, "~")) - 1)
                n, total = out.get(marks[at][1], (0, 0.0))
                out[marks[at][1]] = (n + 1, total + seconds)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-slots", type=int, default=1024)
    parser.add_argument(
        "--copy-rate", type=float, default=0.0,
        help="bytes/s a batch's copy before its seal may take (0: no cap)",
    )  # fmt: skip
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="reshard-bench-"))
    try:
        bench(args, root)
    finally:  # the nodes' data and checkpoints: hundreds of MB a run
        shutil.rmtree(root, ignore_errors=True)


def bench(args: argparse.Namespace, root: Path) -> None:
    """Start the nodes under ``root``, fill the table, move it while the trainer runs."""
    nodes = [NodeProcess(root / f"n{i}", i, 2 if i < 2 else 3) for i in range(3)]
    endpoints = [n.address for n in nodes]
    clients = [ControlClient(e, timeout=STEP_TIMEOUT_S) for e in endpoints]
    spec = TableSpec.model_validate(
        {"name": "bench", "num_embeddings": args.rows, "embedding_dim": args.dim, "shards": 2,
         "optimizer": {"kind": "adam"}}
    )  # fmt: skip
    for client in clients:
        client.call(create_table_rpc(spec, SlotMap.initial(2)))
    trainer = Trainer(endpoints, args.rows, args.dim)
    for start in range(0, args.rows, 50_000):  # every row resident, with optimizer state
        ids = torch.arange(start, min(start + 50_000, args.rows))
        trainer.client.update("bench", ids, torch.randn(len(ids), args.dim))

    started = time.monotonic()
    for client in clients[:2]:
        client.call(save_rpc("baseline"))
    for client in clients[:2]:
        client.call(load_rpc("baseline"))
    checkpoint_s = time.monotonic() - started

    trainer.steps_for(3.0)  # a baseline of steps before the move
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    runner = context.Process(
        target=run_reshards,
        args=(endpoints, str(root / "job.json"), args.batch_slots, args.copy_rate, results),
    )
    runner.start()
    moves: list[dict[str, Any]] = []
    while len(moves) < 2:
        trainer.step()
        with contextlib.suppress(queue.Empty):
            moves.append(results.get_nowait())
        if len(moves) < 2 and not runner.is_alive() and results.empty():
            raise SystemExit(f"the reshard runner failed (exit code {runner.exitcode})")
    runner.join()
    trainer.steps_for(3.0)

    first, last = moves[0]["begin"], moves[-1]["end"]
    before = trainer.median_between(0, first)
    during = trainer.median_between(first, last)
    after = trainer.median_between(last, float("inf"))
    checkpoint_rate = args.rows / checkpoint_s
    cap = f"{args.copy_rate / 1e6:g} MB/s" if args.copy_rate else "none"
    print(
        f"table {args.rows} x {args.dim} (adam), batches of {args.batch_slots} slots, "
        f"copy cap {cap}"
    )
    print("pause: seal call to the source's reply; held: seal to the held writes' refusal")
    header = ("move", "s", "rows", "rows/s", "vs ckpt", "batches", "pause50", "pause99",
              "held50", "held99")  # fmt: skip
    widths = (8, 7, 9, 10, 8, 7, 7, 7, 7, 7)
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    for m in moves:
        print(
            f"{'-> ' + str(m['to_shards']):>8} {m['seconds']:7.2f} {m['rows']:9d} "
            f"{m['rows_per_s']:10.0f} {m['rows_per_s'] / checkpoint_rate:8.2f} "
            f"{m['batches']:7d} {m['pause_p50_ms']:7.1f} {m['pause_p99_ms']:7.1f} "
            f"{m['held_p50_ms']:7.1f} {m['held_p99_ms']:7.1f}"
        )
    for m in moves:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in m["pause_steps_median_ms"].items())
        print(f"-> {m['to_shards']} pause by step (median ms): {parts}")
    print(f"checkpoint save+load: {checkpoint_s:.2f} s, {checkpoint_rate:.0f} rows/s")
    print(
        f"trainer step median: before {1e3 * before:.1f} ms, during {1e3 * during:.1f} ms "
        f"({before / during:.2f}x throughput), after {1e3 * after:.1f} ms"
    )
    spent = trainer.by_step(moves)
    print(
        "trainer during the move, by move step (steps, s, mean ms): "
        + ", ".join(f"{k} {n} {t:.1f} {1e3 * t / n:.0f}" for k, (n, t) in sorted(spent.items()))
    )
    result = {
        "rows": args.rows, "dim": args.dim, "batch_slots": args.batch_slots,
        "copy_rate": args.copy_rate,
        "layout": "nodes and runner in processes of their own, trainer in the bench",
        "moves": moves, "checkpoint_seconds": checkpoint_s,
        "checkpoint_rows_per_s": checkpoint_rate,
        "step_before_s": before, "step_during_s": during, "step_after_s": after,
        "trainer_by_move_step": spent,
    }  # fmt: skip
    out = ROOT / "bench" / "results" / "reshard_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    trainer.client.close()
    for client, node in zip(clients, nodes, strict=True):
        client.close()
        node.stop()


if __name__ == "__main__":
    main()
