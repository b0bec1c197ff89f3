"""First touch of a big dense table, and the SDK's pull against F.embedding.

A dense table is created at once (its arena mapped, nothing faulted in); its
first pull of random ids creates every row it touches, which faults in the
arena pages under them. The memory it touches is measured, not modelled: the
process's resident set grows by the pages the pull faulted in (the value
arena's 2 MiB pages under the new rows, the optimizer state's when the table
has any, the presence bytes of a dense table, the pulled rows' output).
Measured in the same run against what zeroing that much memory costs:
``memset`` over the same number of bytes already resident (torch's ``zero_``,
the same threads) and the first write of a fresh buffer of that size (its page
faults included), in wall time and in the process's CPU time (user + system;
steadier on a shared machine); and against the same table with a zeros
initializer, whose first pull only faults pages in (see ``first_touch``).
Then the same pull once resident, and the
SDK's ``RecStoreClient.pull`` (local backend) against ``F.embedding`` on a
tensor of the same rows, both returning a new tensor (median of paired runs).
Target: first pull <= about the fresh-buffer zeroing; SDK pull >= 1.0x F.embedding.

    python bench/first_touch_bench.py [--rows 20000000,50000000] [--dim 64] [--ids 1000000]
        [--threads 1,2] [--optimizer sgd] [--out bench/results/first_touch_bench.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from recstore import _native
from recstore.client import RecStoreClient
from recstore.core import TableSpec
from recstore.core.spec import Initializer
from recstore.store import Table

ROOT = Path(__file__).resolve().parent.parent


def _resident_bytes() -> int:
    """The process's resident set (pages faulted in and still mapped)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _timed(run: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process: user + system) of ``run()``."""
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    run()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _seconds(run: Any) -> float:
    return _timed(run)[0]


def _first_pull(spec: TableSpec, keys: np.ndarray) -> dict[str, float]:
    """A fresh table's first pull of ``keys``: times, the bytes it faulted in, the same pull
    once resident."""
    tables = [Table(spec)]
    before = _resident_bytes()
    wall, cpu = _timed(lambda: tables[0].pull(keys))
    touched = _resident_bytes() - before
    prefaulted = int(tables[0].stats()["prefaulted_bytes"])  # arena pages: values + state
    resident = _seconds(lambda: tables[0].pull(keys))
    tables.clear()
    gc.collect()
    return {"s": wall, "cpu_s": cpu, "touched": touched, "prefaulted": prefaulted,
            "resident_s": resident}  # fmt: skip


def first_touch(
    rows: int, dim: int, ids: int, threads: int, optimizer: str
) -> dict[str, float | str]:
    """One fresh table: its first pull, the same pull resident, and the zeroing baselines.

    Fair to both sides: the process first takes as much memory as the table will
    touch and gives it back, so neither side pays for the machine handing memory
    over (on a VM the first user of freed page cache pays for reclaim, and a
    baseline run after the table would reuse the pages the table gave back); the
    baseline zeroes the bytes the first pull was measured to fault in; and the
    same table with a zeros initializer separates creating rows (a normal
    initializer's Box-Muller per element) from faulting pages in.
    """
    _native.set_num_threads(threads)
    torch.set_num_threads(threads)
    keys = np.random.default_rng(rows).integers(0, rows, ids)
    spec = TableSpec(
        name="big", num_embeddings=rows, embedding_dim=dim, dtype="float16",
        optimizer={"kind": optimizer},
    )  # fmt: skip
    warm = torch.empty(rows * spec.row_bytes * (2 if optimizer != "sgd" else 1), dtype=torch.uint8)
    warm.zero_()
    del warm
    gc.collect()
    created = time.perf_counter()
    Table(spec)
    create_s = time.perf_counter() - created
    first = _first_pull(spec, keys)
    zeros = _first_pull(spec.model_copy(update={"initializer": Initializer(kind="zeros")}), keys)
    fresh = torch.empty(first["touched"], dtype=torch.uint8)  # mapped, not yet faulted in
    fresh_zero_s, fresh_zero_cpu = _timed(fresh.zero_)
    resident_zero_s = _seconds(fresh.zero_)
    del fresh
    gc.collect()
    return {
        "rows": rows, "dim": dim, "ids": ids, "threads": threads, "optimizer": optimizer,
        "arena_bytes": rows * spec.row_bytes, "touched_bytes": first["touched"],
        "prefaulted_bytes": first["prefaulted"], "create_s": create_s,
        "first_pull_s": first["s"], "first_pull_cpu_s": first["cpu_s"],
        "first_pull_zeros_init_s": zeros["s"], "first_pull_zeros_init_cpu_s": zeros["cpu_s"],
        "resident_pull_s": first["resident_s"],
        "zero_fresh_s": fresh_zero_s, "zero_fresh_cpu_s": fresh_zero_cpu,
        "zero_resident_s": resident_zero_s,
        "first_vs_zero_fresh": first["s"] / fresh_zero_s,
        "first_vs_zero_fresh_cpu": first["cpu_s"] / fresh_zero_cpu,
    }  # fmt: skip


def sdk_vs_embedding(rows: int, dim: int, ids: int, repeats: int) -> dict[str, float]:
    """RecStoreClient.pull (local) against F.embedding on the same rows, paired."""
    weights = torch.randn(rows, dim)
    client = RecStoreClient(role="first-touch-bench")
    client.set_ps_backend("local")
    client.init_data("emb", (rows, dim), torch.float32)
    client.push("emb", torch.arange(rows), weights)
    keys = torch.from_numpy(np.random.default_rng(1).integers(0, rows, ids))
    assert torch.equal(client.pull("emb", keys), F.embedding(keys, weights))
    ours, base = [], []
    for _ in range(repeats):
        ours.append(_seconds(lambda: client.pull("emb", keys)))
        base.append(_seconds(lambda: F.embedding(keys, weights)))
    client.delete_data("emb")
    client.close()
    ratios = [b / o for o, b in zip(ours, base, strict=True)]
    return {
        "rows": rows, "dim": dim, "ids": ids, "sdk_pull_s": statistics.median(ours),
        "embedding_s": statistics.median(base), "sdk_vs_embedding": statistics.median(ratios),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="20000000")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--optimizer", default="sgd", help="sgd: no state; adagrad: 1x state")
    parser.add_argument("--sdk-rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/first_touch_bench.json")
    args = parser.parse_args()
    touches = [
        first_touch(int(rows), args.dim, args.ids, int(threads), args.optimizer)
        for rows in args.rows.split(",")
        for threads in args.threads.split(",")
    ]
    print(
        f"{'rows':>11}{'thr':>4}{'opt':>8}{'touched GB':>11}{'first s':>9}{'(cpu)':>7}"
        f"{'zeros-init s':>13}{'(cpu)':>7}{'resident s':>11}{'zero fresh s':>13}{'(cpu)':>7}"
        f"{'first/zero':>11}{'(cpu)':>7}"
    )
    for t in touches:
        print(
            f"{t['rows']:>11}{t['threads']:>4}{t['optimizer']:>8}{t['touched_bytes'] / 1e9:>11.2f}"
            f"{t['first_pull_s']:>9.3f}{t['first_pull_cpu_s']:>7.2f}"
            f"{t['first_pull_zeros_init_s']:>13.3f}{t['first_pull_zeros_init_cpu_s']:>7.2f}"
            f"{t['resident_pull_s']:>11.3f}{t['zero_fresh_s']:>13.3f}{t['zero_fresh_cpu_s']:>7.2f}"
            f"{t['first_vs_zero_fresh']:>10.2f}x{t['first_vs_zero_fresh_cpu']:>6.2f}x"
        )
    _native.set_num_threads(0)
    torch.set_num_threads(max(int(t) for t in args.threads.split(",")))
    sdk = sdk_vs_embedding(args.sdk_rows, args.dim, args.ids, args.repeats)
    print(
        f"SDK pull {sdk['sdk_pull_s'] * 1e3:.1f} ms vs "
        f"F.embedding {sdk['embedding_s'] * 1e3:.1f} ms"
        f" ({sdk['ids']} ids of {sdk['rows']} x {sdk['dim']} fp32): {sdk['sdk_vs_embedding']:.2f}x"
        " (target >= 1.0x)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"first_touch": touches, "sdk_pull": sdk}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
