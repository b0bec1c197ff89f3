"""Incremental against full checkpoints, and what the change tracker costs a write.

Part 1: a ``--rows`` x ``--dim`` Adagrad table on an in-process node, saved
whole, then ``--touch`` of its rows updated and saved as an increment (the
baseline is the full save of the same node in the same run). Reported: save
seconds and bytes of each, and their ratios.

Part 2: update throughput of one table, batches of ``--batch`` random keys,
with its change tracker on and off, each batch applied both ways in random
order (paired, same process), as rows/s and their ratio: through the node's
Update (the recording alone) and through MultiUpdate (served by the engine
either way; the keys it applied are then recorded).

Prints a table and writes bench/results/incremental_bench.json.

Usage: python bench/incremental_bench.py [--rows 1000000] [--dim 64] [--touch 0.01]
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from recstore.core import TableSpec, wire
from recstore.ps import native_path
from recstore.ps.checkpoint import persistence
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
    """The same table's updates with its tracker on and off, in random order per round."""
    node = Node(directory / "updates")
    rows = min(args.rows, 200_000)
    node.create_table(spec("emb", rows, args.dim, 2), None)
    fill(node, "emb", rows, args.dim)
    hosted = node.tables["emb"]
    tracker = hosted.changes
    rng = np.random.default_rng(1)
    spent = {f"{call}_{how}": 0.0 for call in ("update", "multi") for how in ("off", "on")}
    for _ in range(args.rounds):
        keys = rng.integers(0, rows, args.batch).astype(np.int64)
        grads = rng.standard_normal((args.batch, args.dim)).astype(np.float32)
        multi = wire.encode_multi_update_request(
            [wire.UpdateRequest("emb", 0, keys, grads, "float32", None, args.dim)]
        )
        calls = {
            "update": functools.partial(
                node.update, "emb", keys.tobytes(), grads.tobytes(), "float32", args.dim, None
            ),
            "multi": functools.partial(native_path.serve, node, "MultiUpdate", multi),
        }
        for call, run in calls.items():
            order = ("off", "on") if rng.random() < 0.5 else ("on", "off")
            for how in order:  # either may go first: neither gains from the other's warm caches
                hosted.changes = tracker if how == "on" else None
                started = time.perf_counter()
                run()
                spent[f"{call}_{how}"] += time.perf_counter() - started
    rate = {key: args.rounds * args.batch / seconds for key, seconds in spent.items()}
    result = {f"{key}_rows_per_s": value for key, value in rate.items()}
    for call in ("update", "multi"):
        result[f"{call}_tracked_over_untracked"] = rate[f"{call}_on"] / rate[f"{call}_off"]
    return result


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
