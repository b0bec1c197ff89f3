"""The host cache's hit rates against the offline optimum (Belady's MIN) on Zipf traces.

Zipf traces (alpha 0.8, 1.05, 1.2) over 10M ids, cut into lookups of
``--batch`` ids; each lookup's distinct ids are what a layer hands its cache
(a missed id travels once however often it repeats). For caches of
1/5/10/25% of the rows: the cache's policies (LFU with TinyLFU admission,
LRU; the engine's ``HostRowCache``, held slot by slot to the numpy model)
against Belady's MIN with bypass on the same access sequence, computed here.

Two scores per policy: per distinct id (hits / distinct ids looked up: what
decides the wire) and per id (each hit counted once per occurrence in its
lookup). MIN maximises distinct-id hits; its per-id figure scores the same
decisions. Both are counted over the whole trace (from a cold cache) and over
its last ``--window`` share of lookups (the cache warmed on the rest; MIN
still sees the whole trace). Target: >= 0.9x MIN at every size.

Usage: python bench/cache_hit_bench.py [--trace 4000000] [--batch 4096] [--window 0.5]
       [--alphas 0.8 1.05 1.2] [--fractions 0.01 0.05 0.1 0.25]
The long run (docs/sdk.md quotes it): --trace 40000000 --skip-curve --skip-cost.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
ROWS = 10_000_000
ALPHAS = (0.8, 1.05, 1.2)
FRACTIONS = (0.01, 0.05, 0.10, 0.25)
POLICIES = ("lfu", "lru")
SCORERS = ("min", *POLICIES)


# -- traces ---------------------------------------------------------------------------
def zipf_trace(alpha: float, length: int, rows: int, seed: int) -> np.ndarray:
    """``length`` ids of a Zipf(alpha) popularity over ``rows`` ids, ranks shuffled."""
    rng = np.random.default_rng(seed)
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(length), side="right")
    return rng.permutation(rows)[np.minimum(ranks, rows - 1)].astype(np.int64)


def lookups(trace: np.ndarray, batch: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Each lookup's distinct ids in first-seen order (what a layer hands its cache), and
    per distinct access (concatenated) how often the id occurs in its lookup."""
    lookup_of = np.arange(len(trace), dtype=np.int64) // batch
    # one sort of (lookup, id) pairs finds every lookup's distinct ids at once
    _, first, count = np.unique(
        lookup_of * (int(trace.max(initial=0)) + 1) + trace, return_index=True, return_counts=True
    )
    order = np.argsort(first, kind="stable")
    first, count = first[order], count[order]
    ends = np.searchsorted(lookup_of[first], np.arange(1, -(-len(trace) // batch) + 1))
    return np.split(trace[first], ends[:-1]), count


# -- the offline optimum --------------------------------------------------------------
def belady_hit_mask(sequence: np.ndarray, capacity: int) -> np.ndarray:
    """Which accesses hit under Belady's MIN with bypass: evict (or never admit) the id
    used farthest ahead. The engine runs it (a next-use array and a heap whose stale
    entries are dropped, so memory stays bounded on traces of tens of millions)."""
    from recstore import _native

    return np.asarray(_native.belady_hit_mask(sequence, capacity)).view(np.bool_)


def belady_hits(sequence: np.ndarray, capacity: int) -> int:
    return int(belady_hit_mask(sequence, capacity).sum())


# -- the cache's policies ---------------------------------------------------------------
def policy_hit_mask(
    batches: list[np.ndarray], capacity_rows: int, policy: str
) -> tuple[np.ndarray, int]:
    """(per distinct access: did it hit, rows held) of the engine's cache with room for
    ``capacity_rows`` rows of dim 1, every missed id offered as a layer offers it."""
    from recstore.client.host_cache import bytes_per_row
    from recstore.client.native_host_cache import NativeHostCache

    cache = NativeHostCache(capacity_rows * bytes_per_row(4), 1, torch.float32, policy=policy)
    out = cache.empty_rows(max(len(b) for b in batches))
    hits = []
    for keys in batches:
        missed = cache.lookup_into(keys, out[: len(keys)])
        hit = np.ones(len(keys), dtype=np.bool_)
        hit[missed] = False
        hits.append(hit)
        cache.insert(keys[missed], out[: len(missed)])
    return np.concatenate(hits), cache.capacity_rows


def _scores(hit: np.ndarray, counts: np.ndarray, window: slice) -> dict[str, float]:
    whole = {"distinct": hit.mean(), "ids": (hit * counts).sum() / counts.sum()}
    part, weights = hit[window], counts[window]
    late = {"distinct": part.mean(), "ids": (part * weights).sum() / weights.sum()}
    return {f"{span}_{what}": float(v)
            for span, scores in (("whole", whole), ("window", late))
            for what, v in scores.items()}  # fmt: skip


def hit_rates(args: argparse.Namespace) -> list[dict[str, object]]:
    results = []
    for alpha in args.alphas:
        batches, counts = lookups(zipf_trace(alpha, args.trace, ROWS, seed=1), args.batch)
        sequence = np.concatenate(batches)
        first = int(len(batches) * (1 - args.window))
        window = slice(sum(len(b) for b in batches[:first]), len(sequence))
        for fraction in args.fractions:
            row: dict[str, object] = {
                "alpha": alpha, "fraction": fraction, "accesses": len(sequence),
                "ids": int(counts.sum()),
            }  # fmt: skip
            held = int(ROWS * fraction)
            masks = {}
            for policy in POLICIES:
                masks[policy], held = policy_hit_mask(batches, held, policy)
            started = time.perf_counter()
            masks["min"] = belady_hit_mask(sequence, held)  # the rows the cache holds
            row["min_seconds"] = time.perf_counter() - started
            row["cache_rows"] = held
            # the best a cache can do on a stream this stationary, once warm
            row["static_top"] = static_bound(alpha, fraction, args.batch)
            for scorer, mask in masks.items():
                row[scorer] = _scores(mask, counts, window)
            for policy in POLICIES:
                row[f"{policy}_vs_min"] = {
                    key: score / row["min"][key] if row["min"][key] else 1.0  # type: ignore[index]
                    for key, score in row[policy].items()  # type: ignore[attr-defined]
                }
            results.append(row)
            _print(row)
    return results


def warm_curve(args: argparse.Namespace) -> list[dict[str, float]]:
    """The LFU cache's hit rate per stretch of ``--curve-step`` ids of one long trace (alpha
    1.05, 10% of the rows, lookups of ``--batch``): how long a cold cache takes to warm.
    A static cache of the most popular 10% (each lookup's distinct ids) is the bound."""
    trace = zipf_trace(1.05, args.curve_ids, ROWS, seed=2)
    batches, counts = lookups(trace, args.batch)
    hit, _ = policy_hit_mask(batches, int(ROWS * 0.10), "lfu")
    ends = np.cumsum([len(b) for b in batches])  # distinct accesses up to each lookup's end
    per_stretch = max(1, args.curve_step // args.batch)
    curve = []
    for first in range(0, len(batches), per_stretch):
        last = min(first + per_stretch, len(batches))
        part = slice(int(ends[first - 1]) if first else 0, int(ends[last - 1]))
        curve.append({
            "ids_seen": first * args.batch, "hit_rate_distinct": float(hit[part].mean()),
            "hit_rate_ids": float((hit[part] * counts[part]).sum() / counts[part].sum()),
        })  # fmt: skip
        print(f"after {first * args.batch / 1e6:5.1f}M ids: hit rate distinct "
              f"{curve[-1]['hit_rate_distinct']:.3f}, per id {curve[-1]['hit_rate_ids']:.3f}",
              flush=True)  # fmt: skip
    return curve


def engine_cost(args: argparse.Namespace) -> list[dict[str, float]]:
    """The cache's own CPU per lookup, no wire: a 10% cache (dims 32 and 128) warmed through
    ``gather``/``fill`` on ``--cost-warm`` ids of alpha 1.05, then ``--cost-lookups`` lookups
    timed by this thread's CPU clock, each half apart."""
    from recstore.client.host_cache import bytes_per_row
    from recstore.client.native_host_cache import NativeHostCache

    trace = zipf_trace(1.05, args.cost_warm + args.cost_lookups * args.batch, ROWS, seed=3)
    results = []
    for dim in (32, 128):
        cache = NativeHostCache(int(ROWS * 0.10) * bytes_per_row(dim * 4), dim, torch.float32)
        rows = np.zeros((args.batch, dim), np.float32)
        spent = {"gather": 0.0, "fill": 0.0}
        timed = 0
        for start in range(0, len(trace), args.batch):
            keys = trace[start : start + args.batch]
            out = cache.empty_rows(len(keys))
            started = time.thread_time()
            misses, miss_of = cache.gather(keys, out)
            gathered = time.thread_time()
            cache.fill(miss_of, out, misses, rows[: len(misses)])
            if start >= args.cost_warm:
                timed += 1
                spent["gather"] += gathered - started
                spent["fill"] += time.thread_time() - gathered
        lookups = max(1, timed)
        row = {"dim": dim, "batch": args.batch, "lookups": lookups,
               "gather_ms": spent["gather"] / lookups * 1e3,
               "fill_ms": spent["fill"] / lookups * 1e3}  # fmt: skip
        results.append(row)
        print(f"engine, dim {dim}: gather {row['gather_ms']:.3f} ms + fill {row['fill_ms']:.3f} ms "
              f"CPU a lookup of {args.batch} ids", flush=True)  # fmt: skip
    return results


def static_bound(alpha: float, fraction: float, batch: int) -> dict[str, float]:
    """Hit rates of a cache holding the ``fraction`` most popular ids for good, per distinct
    id of a lookup of ``batch`` ids and per id (exact, from the Zipf probabilities)."""
    p = np.arange(1, ROWS + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    present = -np.expm1(batch * np.log1p(-p))  # is the id among a lookup's ids
    top = int(ROWS * fraction)
    return {"distinct": float(present[:top].sum() / present.sum()), "ids": float(p[:top].sum())}


def _print(row: dict[str, object]) -> None:
    parts = []
    for span in ("whole", "window"):
        for what in ("distinct", "ids"):
            key = f"{span}_{what}"
            parts.append(
                f"{span} {what}: " + " ".join(
                    f"{s} {row[s][key]:.4f}" for s in SCORERS  # type: ignore[index]
                ) + f" (lfu {row['lfu_vs_min'][key]:.3f}x)"  # type: ignore[index]
            )  # fmt: skip
    static = row["static_top"]
    print(f"alpha {row['alpha']:4} cache {row['fraction']:4.0%}  " + "  |  ".join(parts)
          + f"  |  static top: distinct {static['distinct']:.4f} ids {static['ids']:.4f}",  # type: ignore[index]
          flush=True)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=int, default=4_000_000, help="ids per hit-rate trace")
    parser.add_argument("--alphas", type=float, nargs="+", default=ALPHAS, help="Zipf exponents")
    parser.add_argument(
        "--fractions", type=float, nargs="+", default=FRACTIONS, help="cache sizes, share of rows"
    )
    parser.add_argument("--batch", type=int, default=4096, help="ids per lookup")
    parser.add_argument(
        "--window", type=float, default=0.5, help="share of lookups scored warm (the last ones)"
    )
    parser.add_argument("--curve-ids", type=int, default=24_000_000, help="warm-up curve: ids")
    parser.add_argument("--curve-step", type=int, default=2_000_000, help="ids per point")
    parser.add_argument("--cost-warm", type=int, default=8_000_000, help="engine cost: warm ids")
    parser.add_argument("--cost-lookups", type=int, default=500, help="engine cost: timed lookups")


def main() -> int:
    from processes import write_report  # the bench folder: on the path when run as a script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "cache_hit_bench.json"
    )
    parser.add_argument("--skip-table", action="store_true", help="only the warm-up curve")
    parser.add_argument("--skip-curve", action="store_true", help="no warm-up curve")
    parser.add_argument("--skip-cost", action="store_true", help="no engine cost")
    args = parser.parse_args()
    report: dict[str, object] = {"rows": ROWS, "trace": args.trace, "batch": args.batch,
                                 "window": args.window}  # fmt: skip
    if not args.skip_table:
        report["hit_rates"] = hit_rates(args)
    if not args.skip_curve:
        report["static_bound"] = static_bound(1.05, 0.10, args.batch)
        print(f"static top 10% at alpha 1.05: {report['static_bound']}")
        report["warm_curve"] = warm_curve(args)
    if not args.skip_cost:
        report["engine_cost"] = engine_cost(args)
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
