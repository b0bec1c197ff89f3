"""First touch of a big dense table, and the SDK's pull against F.embedding.

A dense table is created at once (its arena mapped, nothing faulted in); its
first pull of random ids creates every row it touches, which faults in the
arena pages under them. Measured in the same run against what zeroing that
much memory costs: ``memset`` over the same number of bytes already resident
(torch's ``zero_``, all threads) and the first write of a fresh buffer of that
size (its page faults included). Then the same pull once resident, and the
SDK's ``RecStoreClient.pull`` (local backend) against ``F.embedding`` on a
tensor of the same rows, both returning a new tensor (median of paired runs).
Target: first pull <= about the fresh-buffer zeroing; SDK pull >= 1.0x F.embedding.

    python bench/first_touch_bench.py [--rows 20000000,50000000] [--dim 64] [--ids 1000000]
        [--threads 1,2] [--out bench/results/first_touch_bench.json]
"""

from __future__ import annotations

import argparse
import gc
import json
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
from recstore.store import Table

ROOT = Path(__file__).resolve().parent.parent
PAGE = 2 << 20  # the arenas' huge-page granularity


def _seconds(run: Any) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def first_touch(rows: int, dim: int, ids: int, threads: int) -> dict[str, float]:
    """One fresh table: its first pull, the same pull resident, and the zeroing baselines."""
    _native.set_num_threads(threads)
    torch.set_num_threads(threads)
    keys = np.random.default_rng(rows).integers(0, rows, ids)
    touched_pages = len(np.unique(keys * dim * 2 // PAGE))
    touched = touched_pages * PAGE
    spec = TableSpec(name="big", num_embeddings=rows, embedding_dim=dim, dtype="float16")
    created = time.perf_counter()
    tables = [Table(spec)]
    create_s = time.perf_counter() - created
    first_s = _seconds(lambda: tables[0].pull(keys))
    resident_s = _seconds(lambda: tables[0].pull(keys))
    tables.clear()  # the arena goes before the baselines map as much memory again
    gc.collect()
    fresh = torch.empty(touched, dtype=torch.uint8)  # mapped, not yet faulted in
    fresh_zero_s = _seconds(fresh.zero_)
    resident_zero_s = _seconds(fresh.zero_)
    del fresh
    gc.collect()
    return {
        "rows": rows, "dim": dim, "ids": ids, "threads": threads,
        "arena_bytes": rows * dim * 2, "touched_bytes": touched,
        "create_s": create_s, "first_pull_s": first_s, "resident_pull_s": resident_s,
        "zero_fresh_s": fresh_zero_s, "zero_resident_s": resident_zero_s,
        "first_vs_zero_fresh": first_s / fresh_zero_s,
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
    parser.add_argument("--sdk-rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/first_touch_bench.json")
    args = parser.parse_args()
    touches = [
        first_touch(int(rows), args.dim, args.ids, int(threads))
        for rows in args.rows.split(",")
        for threads in args.threads.split(",")
    ]
    print(
        f"{'rows':>11}{'thr':>4}{'touched GB':>11}{'first s':>9}{'resident s':>11}"
        f"{'zero fresh s':>13}{'zero resident s':>16}{'first/zero':>11}"
    )
    for t in touches:
        print(
            f"{t['rows']:>11}{t['threads']:>4}{t['touched_bytes'] / 1e9:>11.2f}"
            f"{t['first_pull_s']:>9.3f}{t['resident_pull_s']:>11.3f}{t['zero_fresh_s']:>13.3f}"
            f"{t['zero_resident_s']:>16.3f}{t['first_vs_zero_fresh']:>10.2f}x"
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
