"""GPU benchmark of the CUDA store engine: find throughput and gather vs torch.

Two figures, each measured with CUDA events on one GPU in one run:

* find: keys per second of ``CudaTable.find`` (probe the hashed index, copy the
  dim-64 fp32 rows, write the found mask) on a table filled to its capacity
  (64M rows by default), for batches of 1M..16M resident keys. Bar: >= 2.0e9
  keys/s on an H200 (HierarchicalKV reports 1.98e9 on an A100).
* gather: a fully resident dense table's ``pull`` and ``find`` against
  ``torch.index_select(weight, 0, ids, out=...)`` on a weight of the same shape.
  Bar: ratio (index_select time / ours) >= 1.0.
* gpu_cache: lookups per second of a ``storage: gpu_cache`` table (rows in host
  memory, a GPU cache of 10% of them in front) on Zipf(1.05) batches of GPU
  keys, once the cache is warm, with the hit rate; against NVIDIA's anchor of
  4.32e8 keys/s (a host table with a 10% GPU cache, GB200) and, in the same run,
  the uncached path: torch.index_select on the host weight plus the copy to the GPU.
* nve_layers: the same traces through ``recstore.nve`` layers: an inference
  ``LinearUVM`` layer (the gpu_cache tier, 10% cached) and a ``GPULayer``, each
  also as a training step (lookup, backward, the table's SGD), as ratios to the
  engine's gpu_cache pull and to NVIDIA's anchor.

Prints a table and writes JSON (``--out``). Never run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

FIND_BAR_KEYS_PER_S = 2.0e9
GATHER_BAR_RATIO = 1.0
NVE_ANCHOR_KEYS_PER_S = 4.32e8
# Multiplying by an odd constant is a bijection of int64: distinct, scattered keys.
SCRAMBLE = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64


def parse_sizes(text: str) -> list[int]:
    """'1M,4M,16M' -> [1048576, 4194304, 16777216]."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for part in text.split(","):
        part = part.strip().upper()
        mult = scale.get(part[-1:], 1)
        out.append(int(part[:-1] if part[-1:] in scale else part) * mult)
    return out


def timed_ms(torch: Any, fn: Any, repeats: int, warmup: int = 2) -> float:
    """Mean milliseconds of `repeats` back-to-back calls, timed by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / repeats


def hashed_spec(capacity: int, dim: int) -> Any:
    from recstore.core import TableSpec

    return TableSpec.model_validate(
        {
            "name": "bench_hashed",
            "num_embeddings": capacity,
            "embedding_dim": dim,
            "keys": {"mode": "hashed", "capacity": capacity},
            "initializer": {"kind": "uniform"},
            "storage": "gpu",
        }
    )


def dense_spec(rows: int, dim: int) -> Any:
    from recstore.core import TableSpec

    return TableSpec.model_validate(
        {
            "name": "bench_dense",
            "num_embeddings": rows,
            "embedding_dim": dim,
            "initializer": {"kind": "uniform"},
            "storage": "gpu",
        }
    )


def fill(torch: Any, engine: Any, keys: Any, dim: int, chunk: int) -> None:
    """Insert every key (find-or-insert) in chunks."""
    out = torch.empty((chunk, dim), device="cuda")
    for start in range(0, len(keys), chunk):
        part = keys[start : start + chunk]
        engine.pull(part, out[: len(part)])
    torch.cuda.synchronize()


def bench_find(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    from recstore.store import Table

    table = Table(hashed_spec(args.capacity, args.dim), device="cuda")
    engine = table._engine
    resident = torch.arange(args.capacity, device="cuda", dtype=torch.int64) * SCRAMBLE
    fill(torch, engine, resident, args.dim, min(args.capacity, 1 << 24))
    assert table.size == args.capacity, (table.size, args.capacity)
    rows = []
    for batch in args.batches:
        ids = torch.randint(0, args.capacity, (batch,), device="cuda")
        keys = resident[ids].contiguous()
        absent = (torch.arange(batch, device="cuda") + args.capacity) * SCRAMBLE
        out = torch.empty((batch, args.dim), device="cuda")
        found = torch.empty(batch, dtype=torch.bool, device="cuda")

        def find(k: Any = keys, o: Any = out, f: Any = found) -> None:
            engine.find(k, o, f)

        def find_absent(k: Any = absent, o: Any = out, f: Any = found) -> None:
            engine.find(k, o, f)

        def pull(k: Any = keys, o: Any = out) -> None:
            engine.pull(k, o)

        hit_ms = timed_ms(torch, find, args.repeats)
        if not bool(found.all()):
            raise SystemExit("find missed resident keys")
        miss_ms = timed_ms(torch, find_absent, args.repeats)
        if bool(found.any()):
            raise SystemExit("find reported absent keys as found")
        pull_ms = timed_ms(torch, pull, args.repeats)
        rows.append(
            {
                "batch": batch,
                "find_ms": hit_ms,
                "find_keys_per_s": batch / (hit_ms / 1e3),
                "find_absent_keys_per_s": batch / (miss_ms / 1e3),
                "pull_keys_per_s": batch / (pull_ms / 1e3),
            }
        )
        del ids, keys, absent, out, found
    best = max(r["find_keys_per_s"] for r in rows)
    stats = table.stats()
    return {
        "capacity": args.capacity,
        "dim": args.dim,
        "table_bytes": stats["memory_bytes"],
        "rows": rows,
        "best_find_keys_per_s": best,
        "bar_keys_per_s": FIND_BAR_KEYS_PER_S,
        "met": best >= FIND_BAR_KEYS_PER_S,
    }


def bench_gather(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    from recstore.store import Table

    table = Table(dense_spec(args.dense_rows, args.dim), device="cuda")
    engine = table._engine
    fill(
        torch,
        engine,
        torch.arange(args.dense_rows, device="cuda", dtype=torch.int64),
        args.dim,
        min(args.dense_rows, 1 << 24),
    )
    weight = torch.rand((args.dense_rows, args.dim), device="cuda")
    rows = []
    for batch in args.batches:
        ids = torch.randint(0, args.dense_rows, (batch,), device="cuda")
        out = torch.empty((batch, args.dim), device="cuda")
        found = torch.empty(batch, dtype=torch.bool, device="cuda")

        def baseline(i: Any = ids, o: Any = out) -> None:
            torch.index_select(weight, 0, i, out=o)

        def pull(i: Any = ids, o: Any = out) -> None:
            engine.pull(i, o)

        def find(i: Any = ids, o: Any = out, f: Any = found) -> None:
            engine.find(i, o, f)

        base_ms = timed_ms(torch, baseline, args.repeats)
        pull_ms = timed_ms(torch, pull, args.repeats)
        find_ms = timed_ms(torch, find, args.repeats)
        rows.append(
            {
                "batch": batch,
                "index_select_ms": base_ms,
                "pull_ms": pull_ms,
                "find_ms": find_ms,
                "pull_ratio": base_ms / pull_ms,
                "find_ratio": base_ms / find_ms,
            }
        )
        del ids, out, found
    worst = min(min(r["pull_ratio"], r["find_ratio"]) for r in rows)
    return {
        "rows_in_table": args.dense_rows,
        "dim": args.dim,
        "rows": rows,
        "worst_ratio": worst,
        "bar_ratio": GATHER_BAR_RATIO,
        "met": worst >= GATHER_BAR_RATIO,
    }


def zipf_sampler(torch: Any, rows: int, alpha: float, gen: Any) -> Any:
    """Batches of Zipf(alpha) ids over [0, rows) on the GPU: one popularity order
    for every batch, its hot ids scattered over the range by a fixed permutation."""
    ranks = torch.arange(1, rows + 1, device="cuda", dtype=torch.float64)
    cdf = torch.cumsum(ranks.pow(-alpha), 0)
    cdf /= cdf[-1].clone()
    perm = torch.randperm(rows, device="cuda", generator=gen)

    def sample(batch: int) -> Any:
        u = torch.rand(batch, device="cuda", dtype=torch.float64, generator=gen)
        return perm[torch.searchsorted(cdf, u).clamp_(max=rows - 1)]

    return sample


def bench_gpu_cache(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    from recstore.core import TableSpec
    from recstore.store import Table

    rows_total = args.cache_table_rows
    spec = TableSpec.model_validate(
        {
            "name": "bench_cache",
            "num_embeddings": rows_total,
            "embedding_dim": args.dim,
            "storage": "gpu_cache",
            "gpu_cache": {"rows": rows_total // 10, "ways": 8},
            "initializer": {"kind": "uniform", "seed": 1},
        }
    )
    table = Table(spec, device="cuda")
    engine = table._engine
    host_weight = torch.rand((rows_total, args.dim))
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    batch = args.cache_batch
    sample = zipf_sampler(torch, rows_total, 1.05, gen)
    traces = [sample(batch) for _ in range(args.cache_batches)]
    out = torch.empty((batch, args.dim), device="cuda")
    for ids in traces:  # warm: every row of the trace is in host memory, the cache filled
        engine.pull(ids, out)
    torch.cuda.synchronize()
    before = engine.cache_stats()
    state = {"i": 0}

    def lookup() -> None:
        engine.pull(traces[state["i"] % len(traces)], out)
        state["i"] += 1

    ms = timed_ms(torch, lookup, args.repeats, warmup=0)
    after = engine.cache_stats()
    hits = after["cache_hits"] - before["cache_hits"]
    looked = hits + after["cache_misses"] - before["cache_misses"]
    host_ids = [t.cpu() for t in traces]
    staged = torch.empty((batch, args.dim)).pin_memory()

    def uncached() -> None:
        i = state["i"] % len(host_ids)
        state["i"] += 1
        torch.index_select(host_weight, 0, host_ids[i], out=staged)
        out.copy_(staged)

    base_ms = timed_ms(torch, uncached, args.repeats)
    keys_per_s = batch / (ms / 1e3)
    return {
        "rows_in_table": rows_total,
        "cache_rows": after["cache_capacity_rows"],
        "dim": args.dim,
        "batch": batch,
        "zipf_alpha": 1.05,
        "hit_rate": hits / looked if looked else 0.0,
        "pull_ms": ms,
        "keys_per_s": keys_per_s,
        "uncached_ms": base_ms,
        "ratio_vs_uncached": base_ms / ms,
        "anchor_keys_per_s": NVE_ANCHOR_KEYS_PER_S,
        "ratio_vs_anchor": keys_per_s / NVE_ANCHOR_KEYS_PER_S,
    }


def bench_nve_layers(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    """recstore.nve's GPU layer types on the gpu_cache figure's traces: lookups per
    second of an inference ``LinearUVM`` layer (10% GPU cache) and a ``GPULayer``,
    and a training step (lookup, backward, SGD) of each, against the engine's pull."""
    import recstore.nve as nve

    rows_total, dim, batch = args.cache_table_rows, args.dim, args.cache_batch
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    sample = zipf_sampler(torch, rows_total, 1.05, gen)
    traces = [sample(batch) for _ in range(args.cache_batches)]
    cache_bytes = rows_total // 10 * dim * 4
    kinds = {
        "linear_uvm": (nve.LayerType.LinearUVM, cache_bytes),
        "gpu_layer": (nve.LayerType.GPULayer, 0),
    }
    out: dict[str, Any] = {"rows_in_table": rows_total, "dim": dim, "batch": batch}
    for label, (layer_type, cache) in kinds.items():
        for training in (False, True):
            layer = nve.NVEmbedding(
                rows_total, dim, torch.float32, layer_type,
                gpu_cache_size=cache, optimize_for_training=training,
            )  # fmt: skip
            state = {"i": 0}

            def step(layer: Any = layer, training: bool = training, state: Any = state) -> None:
                keys = traces[state["i"] % len(traces)]
                state["i"] += 1
                if training:
                    layer(keys).sum().backward()
                else:
                    with torch.no_grad():
                        layer(keys)

            for _ in range(len(traces)):  # warm the cache on every trace
                step()
            ms = timed_ms(torch, step, args.repeats, warmup=0)
            key = f"{label}_{'train' if training else 'lookup'}"
            out[key] = {"ms": ms, "keys_per_s": batch / (ms / 1e3)}
            stats = layer.cache_stats()
            if stats.get("enabled"):
                out[key]["hit_rate"] = stats["hit_rate"]
            del layer
            torch.cuda.empty_cache()
    return out


def print_layer_report(layers: dict[str, Any], engine_keys_per_s: float | None) -> None:
    print(
        f"\nrecstore.nve GPU layers: {layers['rows_in_table']:,} rows x dim {layers['dim']}, "
        f"Zipf 1.05 batches of {layers['batch']:,} keys on the GPU"
    )
    print(f"{'layer':>18} {'ms':>9} {'keys/s':>11} {'vs engine':>10} {'vs anchor':>10}")
    for key in ("linear_uvm_lookup", "linear_uvm_train", "gpu_layer_lookup", "gpu_layer_train"):
        r = layers[key]
        engine = f"{r['keys_per_s'] / engine_keys_per_s:.2f}x" if engine_keys_per_s else "-"
        print(
            f"{key:>18} {r['ms']:>9.3f} {r['keys_per_s']:>11.3e} {engine:>10} "
            f"{r['keys_per_s'] / NVE_ANCHOR_KEYS_PER_S:>9.2f}x"
        )


def print_cache_report(cache: dict[str, Any]) -> None:
    print(
        f"\ngpu_cache: {cache['rows_in_table']:,} host rows x dim {cache['dim']} fp32, "
        f"{cache['cache_rows']:,} cached (10%), Zipf 1.05 batches of {cache['batch']:,}"
    )
    print(
        f"hit rate {cache['hit_rate']:.3f}, {cache['pull_ms']:.3f} ms per batch, "
        f"{cache['keys_per_s']:.3e} keys/s = {cache['ratio_vs_anchor']:.2f}x NVIDIA's 4.32e8 "
        f"anchor; uncached host gather + copy {cache['uncached_ms']:.3f} ms "
        f"({cache['ratio_vs_uncached']:.2f}x)"
    )


def print_report(result: dict[str, Any]) -> None:
    find = result["find"]
    print(f"\nGPU: {result['device']}")
    print(f"find on a full hashed table: {find['capacity']:,} rows x dim {find['dim']} fp32")
    print(f"{'batch':>10} {'find keys/s':>14} {'absent keys/s':>14} {'pull keys/s':>14}")
    for r in find["rows"]:
        print(
            f"{r['batch']:>10,} {r['find_keys_per_s']:>14.3e} "
            f"{r['find_absent_keys_per_s']:>14.3e} {r['pull_keys_per_s']:>14.3e}"
        )
    verdict = "met" if find["met"] else "NOT met"
    print(f"best find {find['best_find_keys_per_s']:.3e} keys/s (bar 2.0e9: {verdict})")
    gather = result["gather"]
    print(f"\ngather on a dense table: {gather['rows_in_table']:,} rows, vs torch.index_select")
    header = ("batch", "index_select ms", "pull ms", "find ms", "ratio pull/find")
    print(f"{header[0]:>10} {header[1]:>16} {header[2]:>9} {header[3]:>9} {header[4]:>16}")
    for r in gather["rows"]:
        print(
            f"{r['batch']:>10,} {r['index_select_ms']:>16.3f} {r['pull_ms']:>9.3f} "
            f"{r['find_ms']:>9.3f} {r['pull_ratio']:>8.2f}/{r['find_ratio']:<7.2f}"
        )
    verdict = "met" if gather["met"] else "NOT met"
    print(f"worst ratio {gather['worst_ratio']:.2f} (bar 1.0x: {verdict})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=parse_sizes, default=[64 << 20], help="hashed rows")
    parser.add_argument("--dense-rows", type=parse_sizes, default=[16 << 20])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batches", type=parse_sizes, default=parse_sizes("1M,4M,16M"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--cache-table-rows", type=int, default=8 << 20, help="gpu_cache rows")
    parser.add_argument("--cache-batch", type=int, default=1 << 20)
    parser.add_argument("--cache-batches", type=int, default=4, help="distinct traces cycled")
    parser.add_argument(
        "--only",
        choices=["all", "store", "gpu_cache", "layers"],
        default="all",
        help="which figures",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu_store_bench.json"))
    args = parser.parse_args(argv)
    args.capacity = args.capacity[0]
    args.dense_rows = args.dense_rows[0]

    import torch

    from recstore import _native

    if not (torch.cuda.is_available() and _native.cuda_available()):
        print("gpu_store_bench: needs a CUDA build of recstore._native and a GPU", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"device": _native.cuda_device_name(0), "torch": torch.__version__}
    if args.only in ("all", "store"):
        result["find"] = bench_find(torch, args)
        torch.cuda.empty_cache()  # the hashed table is gone: give its memory back
        result["gather"] = bench_gather(torch, args)
        torch.cuda.empty_cache()
        print_report(result)
    if args.only in ("all", "gpu_cache"):
        result["gpu_cache"] = bench_gpu_cache(torch, args)
        print_cache_report(result["gpu_cache"])
    if args.only in ("all", "gpu_cache", "layers"):
        result["nve_layers"] = bench_nve_layers(torch, args)
        engine = result.get("gpu_cache", {}).get("keys_per_s")
        print_layer_report(result["nve_layers"], engine)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
