"""The host cache against the offline optimum, remote lookups with and without it, staleness.

1. Hit rate: Zipf traces (alpha 0.8, 1.05, 1.2) over 10M ids, cut into
   lookups of ``--batch`` ids (each lookup's distinct ids are what the cache
   sees), for caches of 1/5/10/25% of the rows: the cache's policies (LFU with
   TinyLFU admission, LRU) against Belady's MIN with bypass on the same access
   sequence, computed in this run. Target: >= 0.9x MIN at every size.
2. Remote inference lookups/s at alpha 1.05: an ``NVEmbedding`` Hierarchical
   layer over gRPC to two PS node processes, with a host cache of 10% of the
   rows against none (the SDK's own pull), on the same lookups, interleaved,
   after the cache has looked up ``--remote-warm`` ids (and every timed row was
   read once, so neither pays a row's first touch). The ratio is quoted overall
   and as the median of ``--rounds`` rounds, with the ceiling the hit rate sets
   (misses still cross the wire). Target: >= 3x.
3. Staleness: the DLRM demo model (examples/dlrm_synthetic.py) trained 300
   steps with ``NVEmbeddingBag`` layers, exact and with max_staleness_steps
   k = 0, 1, 4 (same data and seeds): the final loss of each.

The multi-hot training step over gRPC with bf16 transport and the cache is
``bench/cache_step_bench.py``.

Prints tables and writes bench/results/cache_bench.json.

Usage: python bench/cache_bench.py [--trace 1000000] [--batch 4096] [--skip-hit-rates]
       [--skip-remote] [--skip-staleness] [--remote-warm 2000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import heapq
import json
import platform
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

ROWS = 10_000_000
ALPHAS = (0.8, 1.05, 1.2)
FRACTIONS = (0.01, 0.05, 0.10, 0.25)
POLICIES = ("lfu", "lru")
FREE = "free cache (misses only)"


# -- traces ---------------------------------------------------------------------------
def zipf_trace(alpha: float, length: int, rows: int, seed: int) -> np.ndarray:
    """``length`` ids of a Zipf(alpha) popularity over ``rows`` ids, ranks shuffled."""
    rng = np.random.default_rng(seed)
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(length), side="right")
    return rng.permutation(rows)[np.minimum(ranks, rows - 1)].astype(np.int64)


def lookups(trace: np.ndarray, batch: int) -> list[np.ndarray]:
    """Each lookup's distinct ids, in first-seen order (what a layer hands its cache)."""
    out = []
    for start in range(0, len(trace), batch):
        ids = trace[start : start + batch]
        _, first = np.unique(ids, return_index=True)
        out.append(ids[np.sort(first)])
    return out


# -- the offline optimum --------------------------------------------------------------
def next_uses(sequence: np.ndarray) -> np.ndarray:
    """For each access, the position of the next access to the same id (len: never)."""
    n = len(sequence)
    order = np.lexsort((np.arange(n), sequence))
    nxt = np.full(n, n, dtype=np.int64)
    same = sequence[order[1:]] == sequence[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def belady_hits(sequence: np.ndarray, capacity: int) -> int:
    """Hits of Belady's MIN with bypass: evict (or never admit) the id used farthest ahead.

    A max-heap of (next use, id) with lazy deletion: a popped entry whose next use
    is not the id's current one is stale and skipped.
    """
    nxt = next_uses(sequence)
    never = len(sequence)
    cached: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    hits = 0
    for key, use in zip(sequence.tolist(), nxt.tolist(), strict=True):
        if key in cached:
            hits += 1
            cached[key] = use
            heapq.heappush(heap, (-use, key))
            continue
        if use == never or capacity == 0:
            continue  # never used again: not worth a slot
        if len(cached) < capacity:
            cached[key] = use
            heapq.heappush(heap, (-use, key))
            continue
        while True:
            far, victim = heap[0]
            if cached.get(victim) == -far:
                break
            heapq.heappop(heap)
        if -far > use:
            heapq.heappop(heap)
            del cached[victim]
            cached[key] = use
            heapq.heappush(heap, (-use, key))
    return hits


def policy_hits(batches: list[np.ndarray], capacity_rows: int, policy: str) -> tuple[int, int]:
    """(hits, rows held) of ``HostCache`` with room for ``capacity_rows`` rows of dim 1."""
    from recstore.client.host_cache import HostCache, bytes_per_row

    cache = HostCache(capacity_rows * bytes_per_row(4), 1, torch.float32, policy=policy)
    zeros = np.zeros((max(len(b) for b in batches), 1), np.float32)
    for keys in batches:
        hit, _ = cache.lookup(keys)
        missed = keys[~hit]
        cache.insert(missed, zeros[: len(missed)])
    return cache.stats.hits, cache.capacity_rows


def hit_rates(args: argparse.Namespace) -> list[dict[str, object]]:
    results = []
    for alpha in ALPHAS:
        batches = lookups(zipf_trace(alpha, args.trace, ROWS, seed=1), args.batch)
        sequence = np.concatenate(batches)
        for fraction in FRACTIONS:
            rows = int(ROWS * fraction)
            row: dict[str, object] = {
                "alpha": alpha,
                "fraction": fraction,
                "accesses": len(sequence),
            }
            held = rows
            for policy in POLICIES:
                hits, held = policy_hits(batches, rows, policy)
                row[policy] = hits / len(sequence)
            started = time.perf_counter()
            row["min"] = belady_hits(sequence, held) / len(sequence)  # the same rows held
            row["min_seconds"] = time.perf_counter() - started
            row["cache_rows"] = held
            for policy in POLICIES:
                row[f"{policy}_vs_min"] = row[policy] / row["min"] if row["min"] else 1.0
            results.append(row)
            print(
                f"alpha {alpha:4}  cache {fraction:4.0%}  "
                + "  ".join(f"{p} {row[p]:.4f} ({row[f'{p}_vs_min']:.3f}x)" for p in POLICIES)
                + f"  MIN {row['min']:.4f}",
                flush=True,
            )
    return results


# -- remote lookups/s -----------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_nodes(root: Path, shards: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    import grpc

    processes, addresses = [], []
    for index in range(shards):
        port = _free_port()
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(root / f"ps{index}"), "--shard-index", str(index),
             "--num-shards", str(shards), "--log-level", "WARNING"],
            stdout=subprocess.DEVNULL,
        ))  # fmt: skip
        addresses.append(f"127.0.0.1:{port}")
    for address in addresses:
        channel = grpc.insecure_channel(address)
        grpc.channel_ready_future(channel).result(timeout=120)
        channel.close()
    return processes, addresses


def remote(args: argparse.Namespace) -> dict[str, object]:
    import recstore.nve as nve
    from recstore.client import RecStoreClient
    from recstore.client.host_cache import bytes_per_row

    dim, alpha, fraction = args.dim, 1.05, 0.10
    trace = zipf_trace(alpha, args.remote_warm + args.remote_trace, ROWS, seed=2)
    batches = [
        torch.from_numpy(trace[i : i + args.batch]) for i in range(0, len(trace), args.batch)
    ]
    cut = args.remote_warm // args.batch
    warm, timed = batches[:cut], batches[cut:]
    with tempfile.TemporaryDirectory() as root:
        processes, addresses = _start_nodes(Path(root), 2)
        try:
            client = RecStoreClient(role=f"bench_{uuid.uuid4().hex[:8]}")
            client.set_ps_endpoints(addresses)
            name = "cache_bench"
            cache_bytes = int(ROWS * fraction) * bytes_per_row(dim * 4)
            layers = {
                "no cache": nve.NVEmbedding(ROWS, dim, storage=nve.RemoteTable(client, name),
                                            optimize_for_training=False, device="cpu"),
                "host cache 10%": nve.NVEmbedding(
                    ROWS, dim, storage=nve.RemoteTable(client, name), optimize_for_training=False,
                    device="cpu", config={"host_cache_size": cache_bytes}),
            }  # fmt: skip
            cached = layers["host cache 10%"]._cached
            assert cached is not None
            missed: list[torch.Tensor] = []  # the last lookup's missed ids (its first pull)
            pull = cached._pull

            def recording(keys: np.ndarray, skip: frozenset[str]) -> object:
                missed.append(torch.from_numpy(keys.copy()))
                return pull(keys, skip)

            cached._pull = recording  # type: ignore[method-assign]
            with torch.no_grad():
                for keys in warm:  # the cache warmed (and those rows first touched)
                    layers["host cache 10%"](keys)
                for keys in timed:  # the timed rows first touched, so neither layer pays it
                    layers["no cache"](keys)
                before = layers["host cache 10%"].cache_stats()
                labels = [*layers, FREE]
                seconds = {label: [0.0] * args.rounds for label in labels}
                for index, keys in enumerate(timed):
                    slot = index * args.rounds // len(timed)
                    for label, layer in layers.items():
                        missed.clear()
                        started = time.perf_counter()
                        layer(keys)
                        seconds[label][slot] += time.perf_counter() - started
                    # the ceiling, measured: a free cache's lookup pulls only the misses
                    misses = missed[0]
                    started = time.perf_counter()
                    layers["no cache"](misses)
                    seconds[FREE][slot] += time.perf_counter() - started
            ids = sum(len(k) for k in timed)
            rates = {label: ids / sum(s) for label, s in seconds.items()}
            # each round's ratio (same lookups, interleaved), then their median
            ratios = sorted(
                n / c for c, n in zip(seconds["host cache 10%"], seconds["no cache"], strict=True)
            )
            free = sorted(n / f for f, n in zip(seconds[FREE], seconds["no cache"], strict=True))
            stats = layers["host cache 10%"].cache_stats()
            timed_hits = int(stats["hits"]) - int(before["hits"])
            timed_looked = timed_hits + int(stats["misses"]) - int(before["misses"])
            client.delete_data(name)
            client.close()
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=60)
    hit_rate = timed_hits / timed_looked
    result = {
        "alpha": alpha, "cache_fraction": fraction, "dim": dim, "batch": args.batch,
        "warm": args.remote_warm, "lookups": ids, "ids_per_second": rates,
        "speedup": rates["host cache 10%"] / rates["no cache"],
        "speedup_rounds": ratios, "speedup_median": float(np.median(ratios)),
        "cache_stats": stats, "timed_hit_rate": hit_rate,
        # a lookup's misses still cross the wire: 1 / miss share bounds the speed-up
        "speedup_ceiling": 1 / (1 - hit_rate) if hit_rate < 1 else float("inf"),
        # measured: the uncached layer pulling only each lookup's missed ids
        "free_cache_rounds": free, "free_cache_median": float(np.median(free)),
    }  # fmt: skip
    for label, rate in rates.items():
        print(f"remote inference, {label:15}: {rate / 1e6:7.3f} M ids/s")
    print(
        f"speed-up with the cache: {result['speedup']:.2f}x, median of "
        f"{len(ratios)} rounds {result['speedup_median']:.2f}x (hit rate while timed "
        f"{hit_rate:.3f}: ceiling {result['speedup_ceiling']:.2f}x; a free cache, measured: "
        f"median {result['free_cache_median']:.2f}x)"
    )
    return result


# -- staleness against the demo model's loss --------------------------------------------
def staleness(args: argparse.Namespace) -> list[dict[str, object]]:
    from dlrm_synthetic import DLRM, INIT_RANGE, DataConfig, SyntheticClicks, train

    import recstore.nve as nve
    from recstore.client import RecStoreClient

    results = []
    for k in (None, 0, 1, 4):
        torch.manual_seed(0)
        client = RecStoreClient(role=f"stale_{uuid.uuid4().hex[:8]}")
        client.set_ps_backend("local")
        prefix = f"stale_{uuid.uuid4().hex[:8]}"
        config = {} if k is None else {"host_cache_size": 64 << 20, "max_staleness_steps": k}

        def make(
            index: int, rows: int, dim: int, client=client, prefix=prefix, config=config
        ) -> torch.nn.Module:
            storage = nve.RemoteTable(
                client, f"{prefix}_f{index}", optimizer={"kind": "sgd", "lr": args.lr},
                initializer={"kind": "uniform", "low": -INIT_RANGE, "high": INIT_RANGE,
                             "seed": index},
            )  # fmt: skip
            return nve.NVEmbeddingBag(rows, dim, storage=storage, device="cpu", config=config)

        data = SyntheticClicks(DataConfig())
        model = DLRM(DataConfig(), 16, make)
        losses = train(model, data, args.steps, args.lr, progress=False)
        final = float(np.mean(losses[-20:]))
        hit = model.bags[0].cache_stats().get("hit_rate")
        results.append({"max_staleness_steps": k, "final_loss": final, "hit_rate": hit})
        print(f"staleness {'exact' if k is None else k!s:5}: loss over the last 20 of "
              f"{args.steps} steps {final:.4f}  hit rate {hit}")  # fmt: skip
        for name in client.data_name_list():
            client.delete_data(name)
        client.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=int, default=1_000_000, help="ids per hit-rate trace")
    parser.add_argument("--remote-warm", type=int, default=2_000_000, help="ids before timing")
    parser.add_argument("--remote-trace", type=int, default=400_000, help="ids timed")
    parser.add_argument("--rounds", type=int, default=5, help="remote: rounds of the ratio")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--skip-remote", action="store_true")
    parser.add_argument("--skip-hit-rates", action="store_true")
    parser.add_argument("--skip-staleness", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cache_bench.json")
    args = parser.parse_args()
    report: dict[str, object] = {
        "machine": platform.platform(), "rows": ROWS, "trace": args.trace, "batch": args.batch,
    }  # fmt: skip
    if not args.skip_hit_rates:
        report["hit_rates"] = hit_rates(args)
    if not args.skip_remote:
        report["remote"] = remote(args)
    if not args.skip_staleness:
        report["staleness"] = staleness(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
