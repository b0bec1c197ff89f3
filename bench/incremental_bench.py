"""Incremental against full checkpoints, and what the change tracker costs a write.

Part 1: a ``--rows`` x ``--dim`` Adagrad table on an in-process node, saved
whole, then ``--touch`` of its rows updated and saved as an increment (the
baseline is the full save of the same node in the same run). Reported: save
seconds and bytes of each, and their ratios.

Part 2: update throughput of two tables of the same node, one tracked
(``full_every: 2``) and one not, batches of ``--batch`` random keys
alternating between them (paired, same process), as rows/s and their ratio.

Prints a table and writes bench/results/incremental_bench.json.

Usage: python bench/incremental_bench.py [--rows 1000000] [--dim 64] [--touch 0.01]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from recstore.core import TableSpec
from recstore.ps import persistence
from recstore.ps.node import Node

ROOT = Path(__file__).resolve().parent.parent


def spec(name: str, rows: int, dim: int, full_every: int) -> TableSpec:
    return TableSpec.model_validate(
        {"name": name, "num_embeddings": rows, "embedding_dim": dim,
         "optimizer": {"kind": "adagrad", "lr": 0.05}, "checkpoint": {"full_every": full_every}}
    )  # fmt: skip


def fill(node: Node, name: str, rows: int, dim: int, chunk: int = 1 << 16) -> None:
    for start in range(0, rows, chunk):
        keys = np.arange(start, min(start + chunk, rows), dtype=np.int64)
        grads = np.full((len(keys), dim), 0.01, np.float32)
        node.update(name, keys.tobytes(), grads.tobytes(), "float32", dim, None)


def saves(args: argparse.Namespace, directory: Path) -> dict[str, float]:
    node = Node(directory / "saves")
    node.create_table(spec("emb", args.rows, args.dim, 10), None)
    fill(node, "emb", args.rows, args.dim)
    started = time.perf_counter()
    full = persistence.save(node)
    full_s = time.perf_counter() - started
    rng = np.random.default_rng(0)
    touched = rng.choice(args.rows, int(args.rows * args.touch), replace=False).astype(np.int64)
    grads = rng.standard_normal((len(touched), args.dim)).astype(np.float32)
    node.update("emb", touched.tobytes(), grads.tobytes(), "float32", args.dim, None)
    started = time.perf_counter()
    increment = persistence.save(node)
    increment_s = time.perf_counter() - started
    return {
        "full_seconds": full_s, "full_bytes": full.bytes,
        "incremental_seconds": increment_s, "incremental_bytes": increment.bytes,
        "incremental_rows": increment.rows,
        "bytes_ratio": increment.bytes / full.bytes, "seconds_ratio": increment_s / full_s,
    }  # fmt: skip


def tracker_cost(args: argparse.Namespace, directory: Path) -> dict[str, float]:
    node = Node(directory / "updates")
    rows = min(args.rows, 200_000)
    for name, full_every in (("plain", 1), ("tracked", 2)):
        node.create_table(spec(name, rows, args.dim, full_every), None)
        fill(node, name, rows, args.dim)
    rng = np.random.default_rng(1)
    spent = {"plain": 0.0, "tracked": 0.0}
    for _ in range(args.rounds):
        keys = rng.integers(0, rows, args.batch).astype(np.int64).tobytes()
        grads = rng.standard_normal((args.batch, args.dim)).astype(np.float32).tobytes()
        order = ("plain", "tracked") if rng.random() < 0.5 else ("tracked", "plain")
        for name in order:  # either may go first: neither gains from the other's warm caches
            started = time.perf_counter()
            node.update(name, keys, grads, "float32", args.dim, None)
            spent[name] += time.perf_counter() - started
    rate = {name: args.rounds * args.batch / seconds for name, seconds in spent.items()}
    return {
        "untracked_rows_per_s": rate["plain"], "tracked_rows_per_s": rate["tracked"],
        "tracked_over_untracked": rate["tracked"] / rate["plain"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--touch", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        result = {**saves(args, Path(scratch)), **tracker_cost(args, Path(scratch))}
    for key, value in result.items():
        print(f"{key:28s} {value:,.4f}" if isinstance(value, float) else f"{key:28s} {value:,}")
    out = ROOT / "bench" / "results" / "incremental_bench.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), **result}, indent=1))


if __name__ == "__main__":
    main()
