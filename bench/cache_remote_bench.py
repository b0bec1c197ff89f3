"""Remote inference lookups/s with a 10% host cache against none, and where the time goes.

An ``NVEmbedding`` Hierarchical layer over gRPC to two PS node processes on
loopback, Zipf(1.05) ids over 10M rows, a host cache of 10% of the rows. For
each dim (``--dims``) one table and one cached layer, warmed on
``--remote-warm`` ids in lookups of the first batch size; then for each batch
size (``--batches``) ``--remote-trace`` ids timed, every timed row read once
beforehand so no variant pays a row's first touch. Per lookup, interleaved:

- ``no cache``: the uncached layer (the SDK's pull; each distinct id travels once);
- ``no cache, cache's path``: a layer whose host cache holds no row (its size
  under one set): the cached path's engine de-dup, MultiPull and scatter with
  every id a miss, i.e. the uncached lookup without torch's unique and gather;
- ``host cache 10%``: the cached layer, its own work split into the engine's
  gather (de-dup, probe, hit rows copied), the pull of the misses (one
  MultiPull per node, versions on every reply) and the fill (missed rows
  copied and offered to the cache);
- ``free cache``: the uncached layer pulling only that lookup's misses (what a
  cache costing nothing would take);
- ``round trip``: a MultiPull of no ids to every node (what every exact lookup
  pays however few ids it misses).

The ratio is quoted overall and as the median of ``--rounds`` rounds, with the
ceiling the hit rate sets (1 / miss share: misses still cross the wire) and
the split of both lookups' time, so the reader sees what bounds it. Each
variant's CPU time is counted too, the client's (its process, every thread)
and the nodes' (every thread of both node processes, from the scheduler's
per-thread accounting): wall time on a shared machine mostly measures waiting
for a core, CPU time is what the lookup costs wherever it runs.

Usage: python bench/cache_remote_bench.py [--dims 32 128] [--batches 4096 16384]
       [--remote-warm 16000000] [--remote-trace 400000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from cache_bench import ROOT, _start_nodes
from cache_hit_bench import ROWS, zipf_trace
from processes import process_cpu_seconds, write_report

ALPHA, FRACTION = 1.05, 0.10
NONE, LEAN, CACHED = "no cache", "no cache, cache's path", "host cache 10%"
FREE, TRIP = "free cache", "round trip"
PARTS = ("gather", "pull", "fill")


class NodeCpu:
    """CPU seconds the node processes have run, every thread (``/proc/*/task/*/schedstat``)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def seconds(self) -> float:
        return sum(process_cpu_seconds(pid) for pid in self.pids)


class Timed:
    """Wraps callables of one object, adding each call's seconds to ``spent[part]``."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(PARTS, 0.0)
        self.missed: list[np.ndarray] = []  # each lookup's missed distinct ids
        self.positions = 0  # ids looked up (with repeats)
        self.hit_positions = 0  # of them, served from the cache

    def wrap(self, owner: Any, attribute: str, part: str) -> None:
        inner: Callable[..., Any] = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = inner(*args, **kwargs)
            self.spent[part] += time.perf_counter() - started
            if part == "gather":
                misses, miss_of = result
                self.missed.append(misses.copy())
                self.positions += len(miss_of)
                self.hit_positions += int(np.count_nonzero(miss_of < 0))
            return result

        setattr(owner, attribute, timed)


def _batches(trace: np.ndarray, batch: int) -> list[torch.Tensor]:
    return [torch.from_numpy(trace[i : i + batch]) for i in range(0, len(trace), batch)]


def one_dim(
    client: Any, dim: int, args: argparse.Namespace, trace: np.ndarray, nodes: NodeCpu
) -> list[dict[str, object]]:
    import recstore.nve as nve
    from recstore.client.host_cache import bytes_per_row

    name = f"cache_remote_{dim}_{uuid.uuid4().hex[:6]}"
    cache_bytes = int(ROWS * FRACTION) * bytes_per_row(dim * 4)
    plain = nve.NVEmbedding(ROWS, dim, storage=nve.RemoteTable(client, name),
                            optimize_for_training=False, device="cpu")  # fmt: skip
    lean = nve.NVEmbedding(  # one byte of cache: no set, every id a miss
        ROWS, dim, storage=nve.RemoteTable(client, name), optimize_for_training=False,
        device="cpu", config={"host_cache_size": 1},
    )  # fmt: skip
    cached_layer = nve.NVEmbedding(
        ROWS, dim, storage=nve.RemoteTable(client, name), optimize_for_training=False,
        device="cpu", config={"host_cache_size": cache_bytes},
    )  # fmt: skip
    cached = cached_layer._cached
    assert cached is not None
    warm = _batches(trace[: args.remote_warm], args.batches[0])
    results = []
    with torch.no_grad():
        started = time.perf_counter()
        for keys in warm:
            cached_layer(keys)
        warm_s = time.perf_counter() - started
        so_far = cached_layer.cache_stats()["hit_rate"]
        print(f"dim {dim}: warmed on {args.remote_warm} ids in {warm_s:.0f} s, "
              f"hit rate so far {so_far:.3f}", flush=True)  # fmt: skip
        start = args.remote_warm
        for batch in args.batches:
            timed = _batches(trace[start : start + args.remote_trace], batch)
            start += args.remote_trace
            layers = (plain, lean, cached_layer)
            results.append(_timed(client, name, layers, cached, timed, dim, batch, args, nodes))
    client.delete_data(name)
    return results


def _timed(
    client: Any, name: str, layers: tuple[Any, Any, Any], cached: Any,
    timed: list[torch.Tensor], dim: int, batch: int, args: argparse.Namespace, nodes: NodeCpu,
) -> dict[str, object]:  # fmt: skip
    plain, lean, layer = layers
    for keys in timed:  # every timed row first touched, so no variant pays it
        plain(keys)
    probe = Timed()
    probe.wrap(cached.cache, "gather", "gather")
    probe.wrap(cached, "_pull", "pull")
    probe.wrap(cached.cache, "fill", "fill")
    before = layer.cache_stats()
    rounds = args.rounds
    labels = (NONE, LEAN, CACHED, FREE, TRIP)
    seconds = {label: [0.0] * rounds for label in labels}
    client_cpu, node_cpu = dict.fromkeys(labels, 0.0), dict.fromkeys(labels, 0.0)
    distinct = 0
    nothing = torch.empty(0, dtype=torch.int64)
    pull_versioned = client._for_modules.pull_versioned
    for index, keys in enumerate(timed):
        slot = index * rounds // len(timed)
        distinct += int(torch.unique(keys).numel())
        for label, run in (
            (NONE, lambda keys=keys: plain(keys)),
            (LEAN, lambda keys=keys: lean(keys)),
            (CACHED, lambda keys=keys: layer(keys)),
            (FREE, lambda: plain(torch.from_numpy(probe.missed[-1]))),
            (TRIP, lambda: pull_versioned(name, nothing)),
        ):
            node_before = nodes.seconds()
            cpu_before, started = time.process_time(), time.perf_counter()
            run()
            seconds[label][slot] += time.perf_counter() - started
            client_cpu[label] += time.process_time() - cpu_before
            node_cpu[label] += nodes.seconds() - node_before
    for attribute, owner in (("gather", cached.cache), ("fill", cached.cache), ("_pull", cached)):
        delattr(owner, attribute)  # the instance's wrappers go; the class's methods serve again
    after = layer.cache_stats()
    hits = int(after["hits"]) - int(before["hits"])
    looked = hits + int(after["misses"]) - int(before["misses"])
    ids, lookups = sum(len(k) for k in timed), len(timed)
    rates = {label: ids / sum(s) for label, s in seconds.items() if label != TRIP}
    ratios = sorted(n / c for c, n in zip(seconds[CACHED], seconds[NONE], strict=True))
    lean_ratios = sorted(n / c for c, n in zip(seconds[CACHED], seconds[LEAN], strict=True))
    free = sorted(n / f for f, n in zip(seconds[FREE], seconds[NONE], strict=True))
    hit_rate = hits / looked
    per_lookup_ms = {label: sum(s) / lookups * 1e3 for label, s in seconds.items()}
    parts_ms = {part: s / lookups * 1e3 for part, s in probe.spent.items()}
    parts_ms["rest"] = per_lookup_ms[CACHED] - sum(parts_ms.values())
    cpu_ms = {label: {"client": client_cpu[label] / lookups * 1e3,
                      "nodes": node_cpu[label] / lookups * 1e3} for label in labels}  # fmt: skip
    total_cpu = {label: sum(v.values()) for label, v in cpu_ms.items()}
    result: dict[str, object] = {
        "alpha": ALPHA, "cache_fraction": FRACTION, "dim": dim, "batch": batch,
        "warm": args.remote_warm, "lookups": lookups, "ids": ids,
        "distinct_per_lookup": distinct / lookups, "misses_per_lookup": (looked - hits) / lookups,
        "ids_per_second": rates, "speedup": rates[CACHED] / rates[NONE],
        "speedup_rounds": ratios, "speedup_median": float(np.median(ratios)),
        "speedup_vs_cache_path": rates[CACHED] / rates[LEAN],
        "speedup_vs_cache_path_median": float(np.median(lean_ratios)),
        "hit_rate_distinct": hit_rate, "hit_rate_ids": probe.hit_positions / probe.positions,
        "speedup_ceiling": 1 / (1 - hit_rate) if hit_rate < 1 else float("inf"),
        "free_cache_rounds": free, "free_cache_median": float(np.median(free)),
        "per_lookup_ms": per_lookup_ms, "cached_parts_ms": parts_ms, "cpu_ms": cpu_ms,
        # lookups/s where CPU is the limit (client and nodes on cores of their own)
        "cpu_speedup": total_cpu[NONE] / total_cpu[CACHED],
        "cpu_speedup_vs_cache_path": total_cpu[LEAN] / total_cpu[CACHED],
    }  # fmt: skip
    _print(result)
    return result


def _print(r: dict[str, Any]) -> None:
    ms, parts = r["per_lookup_ms"], r["cached_parts_ms"]
    print(
        f"dim {r['dim']:4} batch {r['batch']:6}: cached / uncached {r['speedup']:.2f}x "
        f"(median of rounds {r['speedup_median']:.2f}x; against the cache's path without rows "
        f"{r['speedup_vs_cache_path_median']:.2f}x; free cache {r['free_cache_median']:.2f}x; "
        f"ceiling {r['speedup_ceiling']:.2f}x) hit rate distinct {r['hit_rate_distinct']:.3f} "
        f"per id {r['hit_rate_ids']:.3f}; {r['distinct_per_lookup']:.0f} distinct, "
        f"{r['misses_per_lookup']:.0f} missed a lookup",
        flush=True,
    )
    print(
        f"    ms a lookup: uncached {ms[NONE]:.2f} (cache's path {ms[LEAN]:.2f}), cached "
        f"{ms[CACHED]:.2f} = gather {parts['gather']:.2f} + pull {parts['pull']:.2f} + fill "
        f"{parts['fill']:.2f} + rest {parts['rest']:.2f}; free cache {ms[FREE]:.2f}; "
        f"empty round trip {ms[TRIP]:.2f}",
        flush=True,
    )
    cpu = r["cpu_ms"]
    print(
        "    CPU ms a lookup (client + nodes): "
        + ", ".join(f"{label} {c['client']:.2f} + {c['nodes']:.2f}" for label, c in cpu.items())
        + f"; CPU speed-up {r['cpu_speedup']:.2f}x (against the cache's path "
        f"{r['cpu_speedup_vs_cache_path']:.2f}x)",
        flush=True,
    )


def remote(args: argparse.Namespace) -> list[dict[str, object]]:
    from recstore.client import RecStoreClient

    length = args.remote_warm + args.remote_trace * len(args.batches)
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as root:
        processes, addresses = _start_nodes(Path(root), 2)
        try:
            client = RecStoreClient(role=f"bench_{uuid.uuid4().hex[:8]}")
            client.set_ps_endpoints(addresses)
            for dim in args.dims:
                trace = zipf_trace(ALPHA, length, ROWS, seed=2)
                nodes = NodeCpu([process.pid for process in processes])
                results.extend(one_dim(client, dim, args, trace, nodes))
            client.close()
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=60)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dims", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--batches", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--remote-warm", type=int, default=16_000_000, help="ids before timing")
    parser.add_argument("--remote-trace", type=int, default=400_000, help="ids timed per batch")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the ratio")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "cache_remote_bench.json"
    )
    args = parser.parse_args()
    report = {"rows": ROWS, "remote": remote(args)}
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
