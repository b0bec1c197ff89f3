"""Online resharding 2 -> 3 -> 2 while a trainer runs, against a checkpoint save + load.

Three PS nodes run in this process on loopback (two sized for 2 shards, one
for 3, as the local provisioner starts them). A table of ``--rows`` x ``--dim``
(adam, so optimizer state moves too) is filled, a trainer thread updates
random rows through the SDK, and ``recstore.core.migration_run`` moves the
table to 3 shards and back. Reported: each move's time and rows/s, the write
pause per slot batch (seal until the source refuses the slots; p50/p99), the
trainer's step time before / during / after, and, as the baseline in the same
run, a checkpoint Save + Load of the same rows on every node (rows/s).
Prints a table and writes bench/results/reshard_bench.json.

Usage: python bench/reshard_bench.py [--rows 200000] [--dim 64] [--batch-slots 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from recstore import RecStoreClient
from recstore.core import SlotMap, TableSpec
from recstore.core.control import ControlClient, create_table_rpc, load_rpc, save_rpc
from recstore.core.migration import MigrationJob
from recstore.core.migration_run import MigrationRun
from recstore.local.migration_store import FileJobStore
from recstore.ps.server import start_in_thread

ROOT = Path(__file__).resolve().parent.parent


class Trainer:
    """Steps of 256 random rows (update, then a pull that waits for it), timed."""

    def __init__(self, endpoints: list[str], name: str, rows: int, dim: int) -> None:
        self.client = RecStoreClient(role="reshard-bench")
        self.client.set_ps_endpoints(endpoints)
        self.client.init_data(name, (rows, dim), torch.float32, optimizer={"kind": "adam"})
        self.name, self.rows, self.dim = name, rows, dim
        self.times: list[tuple[float, float]] = []  # (end, seconds)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        rng = np.random.default_rng(0)
        while not self.stop.is_set():
            ids = torch.from_numpy(rng.integers(0, self.rows, 256))
            started = time.perf_counter()
            self.client.update(self.name, ids, torch.randn(256, self.dim))
            self.client.pull(self.name, ids[:8])
            now = time.perf_counter()
            self.times.append((now, now - started))

    def median_between(self, start: float, end: float) -> float:
        inside = [s for t, s in self.times if start <= t <= end]
        return statistics.median(inside) if inside else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-slots", type=int, default=1024)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="reshard-bench-"))
    handles = [
        start_in_thread(data_dir=root / f"n{i}", shard_index=i, num_shards=2 if i < 2 else 3)
        for i in range(3)
    ]
    endpoints = [h.address for h in handles]
    clients = [ControlClient(e, timeout=600) for e in endpoints]
    spec = TableSpec.model_validate(
        {"name": "bench", "num_embeddings": args.rows, "embedding_dim": args.dim, "shards": 2,
         "optimizer": {"kind": "adam"}}
    )  # fmt: skip
    for client in clients:
        client.call(create_table_rpc(spec, SlotMap.initial(2)))
    store = FileJobStore(root / "job.json", SlotMap.initial(2))
    trainer = Trainer(endpoints, "bench", args.rows, args.dim)
    for start in range(0, args.rows, 50_000):  # every row resident, with optimizer state
        ids = torch.arange(start, min(start + 50_000, args.rows))
        trainer.client.update("bench", ids, torch.randn(len(ids), args.dim))

    started = time.perf_counter()
    for client in clients[:2]:
        client.call(save_rpc("baseline"))
    for client in clients[:2]:
        client.call(load_rpc("baseline"))
    checkpoint_s = time.perf_counter() - started

    trainer.thread.start()
    time.sleep(2.0)  # a baseline of steps before the move
    moves = []
    for shards in (3, 2):
        run = MigrationRun("bench", clients, store)
        begin = time.perf_counter()
        job = run.run(MigrationJob.start("bench", store.slot_map(), shards, args.batch_slots))
        end = time.perf_counter()
        moved = int(sum(r.seal_checksums.rows.sum() for r in run.records))
        pauses = sorted(r.pause_s for r in run.records)
        moves.append({
            "to_shards": shards, "seconds": end - begin, "rows": moved,
            "rows_per_s": moved / (end - begin), "bytes": job.bytes_moved,
            "batches": len(job.batches),
            "pause_p50_ms": 1e3 * pauses[len(pauses) // 2],
            "pause_p99_ms": 1e3 * pauses[min(len(pauses) - 1, int(0.99 * len(pauses)))],
            "begin": begin, "end": end,
        })  # fmt: skip
    time.sleep(2.0)
    trainer.stop.set()
    trainer.thread.join()

    first, last = moves[0]["begin"], moves[-1]["end"]
    before = trainer.median_between(0, first)
    during = trainer.median_between(first, last)
    after = trainer.median_between(last, float("inf"))
    checkpoint_rate = args.rows / checkpoint_s
    print(f"table {args.rows} x {args.dim} (adam), batches of {args.batch_slots} slots")
    header = ("move", "s", "rows", "rows/s", "vs ckpt", "p50 ms", "p99 ms")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (8, 7, 9, 10, 8, 7, 7), strict=True)))
    for m in moves:
        print(
            f"{'-> ' + str(m['to_shards']):>8} {m['seconds']:7.2f} {m['rows']:9d} "
            f"{m['rows_per_s']:10.0f} {m['rows_per_s'] / checkpoint_rate:8.2f} "
            f"{m['pause_p50_ms']:7.1f} {m['pause_p99_ms']:7.1f}"
        )
    print(f"checkpoint save+load: {checkpoint_s:.2f} s, {checkpoint_rate:.0f} rows/s")
    print(
        f"trainer step median: before {1e3 * before:.1f} ms, during {1e3 * during:.1f} ms "
        f"({before / during:.2f}x throughput), after {1e3 * after:.1f} ms"
    )
    result = {
        "rows": args.rows, "dim": args.dim, "batch_slots": args.batch_slots, "moves": moves,
        "checkpoint_seconds": checkpoint_s, "checkpoint_rows_per_s": checkpoint_rate,
        "step_before_s": before, "step_during_s": during, "step_after_s": after,
    }  # fmt: skip
    out = ROOT / "bench" / "results" / "reshard_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    trainer.client.close()
    for client, handle in zip(clients, handles, strict=True):
        client.close()
        handle.stop()


if __name__ == "__main__":
    main()
