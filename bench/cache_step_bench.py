"""The multi-hot training step over gRPC: fp32 against bf16 transport and the host cache.

``tbe_workloads``' step (8 tables of 200k x 64, batch 2048, 10 ids a bag) to two
PS node processes on loopback. Variants, interleaved round by round on the same
batches (``--steps`` batches of warm-up, then a fresh batch every timed step:
a replayed batch would hit the rows it read itself), each with tables of its
own:

- ``fp32, no cache``: ``recstore.nn.EmbeddingBagCollection``, float32 transport
  (the baseline every ratio is taken against, in this run);
- ``bf16, no cache``: the same collection with bfloat16 transport;
- ``bf16 + cache k=K, per layer``: ``NVEmbeddingBag`` layers with a host cache of
  ``--cache`` of the rows and ``max_staleness_steps`` K, used one by one (one
  MultiPull per layer and node);
- ``bf16 + cache k=K, collection``: the same layers in an
  ``NVEmbeddingBagCollection`` (one MultiPull and one MultiUpdate per node).

Workloads: uniform ids with SGD; Zipf(1.05) ids with row-wise Adagrad drawn over
a new permutation of the rows every batch (``tbe_workloads``: no row stays hot);
and Zipf(1.05) over a fixed popularity permutation per table (hot rows stay
hot across batches, as in real traffic). The target (bf16 + cache <= 0.6x of
fp32 uncached) is judged on the fixed-popularity workload: a cache can only
help where the same rows come back, and that is how ids of real features
behave; the other two are reported as the bounds (nothing to cache).

Per variant: the median step, its ratio to the baseline, wire bytes per step
(request and reply bytes counted at the SDK's send), CPU seconds per step of
this process and of the node processes (/proc), table 0's hit rate. Also the
native fp32<->bf16 conversion of one step's rows against a copy of them.

Prints a table and writes bench/results/cache_step_bench.json.

Usage: python bench/cache_step_bench.py [--steps 3] [--rounds 3] [--cache 0.25]
       [--staleness 1 4] [--workloads uniform-sgd zipf-rowwise-adagrad zipf-fixed-rowwise-adagrad]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import cache_bench  # noqa: E402  (its node launcher)
import tbe_workloads as tw  # noqa: E402
from processes import write_report  # noqa: E402

TABLES, ROWS, DIM, BATCH = 8, 200_000, 64, 2048
FIXED = "zipf-fixed-rowwise-adagrad"
BASE = "fp32, no cache"


def fixed_popularity_batches(work: tw.Workload, count: int) -> list[tw.Batch]:
    """``tw.batches`` with Zipf ranks mapped through one permutation per table, kept for
    every batch: the same rows are hot in every batch."""
    assert work.zipf is not None
    rng = np.random.default_rng(7)
    hot = [rng.permutation(ROWS) for _ in range(TABLES)]
    out = []
    for _ in range(count):
        ids = [
            torch.from_numpy(order[(rng.zipf(work.zipf, (BATCH, work.bag_size)) - 1) % ROWS])
            for order in hot
        ]
        target = torch.from_numpy(rng.normal(0, 1, (BATCH, TABLES * DIM)).astype(np.float32))
        out.append((ids, target))
    return out


def workload_batches(name: str, count: int) -> tuple[tw.Workload, list[tw.Batch]]:
    if name == FIXED:
        work = replace(tw.WORKLOADS[1], name=FIXED)
        return work, fixed_popularity_batches(work, count)
    work = next(w for w in tw.WORKLOADS if w.name == name)
    return work, tw.batches(work, [ROWS] * TABLES, BATCH, DIM, count)


class NveBags(torch.nn.Module):
    """``tw.RecStoreBags``' tables as ``NVEmbeddingBag`` layers with a host cache whose rows
    serve at most ``k`` steps, used one by one or as an ``NVEmbeddingBagCollection``."""

    def __init__(
        self, client: object, work: tw.Workload, k: int, cache_rows: int, together: bool
    ) -> None:
        import recstore.nve as nve
        from recstore.client.host_cache import bytes_per_row

        super().__init__()
        prefix = f"nve_{uuid.uuid4().hex[:8]}"
        config = {"host_cache_size": cache_rows * bytes_per_row(DIM * 4), "max_staleness_steps": k}
        optimizer = {"kind": work.optimizer, "lr": work.lr, "eps": tw.EPS}
        self.bags = torch.nn.ModuleList(
            nve.NVEmbeddingBag(
                ROWS, DIM, device="cpu", config=config,
                storage=nve.RemoteTable(
                    client, f"{prefix}_{i}", optimizer=optimizer,  # type: ignore[arg-type]
                    initializer={"kind": "uniform", "low": -tw.INIT_RANGE,
                                 "high": tw.INIT_RANGE, "seed": i},
                ),
            )
            for i in range(TABLES)
        )  # fmt: skip
        self.collection = nve.NVEmbeddingBagCollection(list(self.bags)) if together else None

    def forward(self, ids: list[torch.Tensor]) -> torch.Tensor:
        if self.collection is not None:
            return torch.cat(self.collection(ids), dim=1)
        return torch.cat([bag(x) for bag, x in zip(self.bags, ids, strict=True)], dim=1)


class WireBytes:
    """Request and reply bytes of every data-path call this process sends."""

    def __init__(self) -> None:
        from recstore.client.remote.nodes import NodeCalls

        self.total = 0
        send = NodeCalls._send

        def counting(calls: NodeCalls, method: str, request: Any, *rest: Any) -> bytes:
            reply = send(calls, method, request, *rest)
            parts = request if isinstance(request, tuple) else (request,)  # a named write's id
            self.total += sum(len(part) for part in parts) + len(reply)
            return reply

        NodeCalls._send = counting  # type: ignore[method-assign]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def conversion(rows: int) -> dict[str, float]:
    """ms of the native fp32 -> bf16 -> fp32 conversion of ``rows`` rows against a copy."""
    from recstore import _native

    values = np.random.default_rng(0).standard_normal((rows, DIM)).astype(np.float32)
    bits = np.empty(values.shape, np.uint16)
    back = np.empty_like(values)
    best = {"to_bf16_ms": np.inf, "from_bf16_ms": np.inf, "copy_fp32_ms": np.inf}
    for _ in range(5):
        started = time.perf_counter()
        _native.convert_rows(values, "float32", bits, "bfloat16")
        middle = time.perf_counter()
        _native.convert_rows(bits, "bfloat16", back, "float32")
        done = time.perf_counter()
        np.copyto(back, values)
        copied = time.perf_counter()
        spans = (middle - started, done - middle, copied - done)
        for key, seconds in zip(best, spans, strict=True):
            best[key] = min(best[key], seconds * 1e3)
    return {"rows": rows, **best}


def run_workload(
    args: argparse.Namespace,
    name: str,
    addresses: list[str],
    node_pids: list[int],
    wire: WireBytes,
) -> list[dict[str, object]]:
    from recstore.client import RecStoreClient

    # fresh batches for every step (a replayed batch would hit rows it read itself)
    work, data = workload_batches(name, args.steps * (args.rounds + 1))
    warm, timed = data[: args.steps], data[args.steps :]
    clients: list[RecStoreClient] = []

    def client(transport: str | None) -> RecStoreClient:
        made = RecStoreClient(role=f"step_{uuid.uuid4().hex[:8]}")
        made.set_ps_endpoints(addresses)
        if transport is not None:
            made.set_transport_dtype(transport)
        clients.append(made)
        return made

    variants: dict[str, Callable[[], torch.nn.Module]] = {
        BASE: lambda: tw.RecStoreBags(client(None), work, [ROWS] * TABLES, DIM),
        "bf16, no cache": lambda: tw.RecStoreBags(client("bfloat16"), work, [ROWS] * TABLES, DIM),
    }
    cache_rows = int(ROWS * args.cache)
    for k in args.staleness:
        for together, how in ((False, "per layer"), (True, "collection")):
            variants[f"bf16 + cache k={k}, {how}"] = lambda k=k, together=together: NveBags(
                client("bfloat16"), work, k, cache_rows, together
            )
    models = {label: make() for label, make in variants.items()}
    for model in models.values():  # warm-up: tables touched, caches filled
        for batch in warm:
            tw.step(model, None, batch)
    times: dict[str, list[float]] = {label: [] for label in models}
    used = {label: [0, 0.0, 0.0] for label in models}  # bytes, client CPU, node CPU
    for round_index in range(args.rounds):
        batches = timed[round_index * args.steps : (round_index + 1) * args.steps]
        for label, model in models.items():
            bytes_before, cpu_before = wire.total, time.process_time()
            nodes_before = cpu_seconds(node_pids)
            for batch in batches:
                started = time.perf_counter()
                tw.step(model, None, batch)
                times[label].append(time.perf_counter() - started)
            used[label][0] += wire.total - bytes_before
            used[label][1] += time.process_time() - cpu_before
            used[label][2] += cpu_seconds(node_pids) - nodes_before
    steps = len(timed)
    medians = {label: float(np.median(t)) for label, t in times.items()}
    results = []
    for label, median in medians.items():
        model = models[label]
        hit = model.bags[0].cache_stats().get("hit_rate") if isinstance(model, NveBags) else None
        # (over warm-up and timed steps, table 0)
        row = {
            "workload": name, "variant": label, "median_step_s": median,
            "vs_fp32_uncached": median / medians[BASE],
            "wire_bytes_per_step": used[label][0] / steps,
            "client_cpu_s_per_step": used[label][1] / steps,
            "node_cpu_s_per_step": used[label][2] / steps, "hit_rate_table_0": hit,
        }  # fmt: skip
        results.append(row)
        shown = "" if hit is None else f"  hit rate {hit:.3f}"
        print(
            f"{name:26} {label:30} {median * 1e3:7.1f} ms {median / medians[BASE]:5.2f}x  "
            f"{row['wire_bytes_per_step'] / 1e6:6.2f} MB  cpu client "  # type: ignore[operator]
            f"{row['client_cpu_s_per_step'] * 1e3:6.1f} ms nodes "  # type: ignore[operator]
            f"{row['node_cpu_s_per_step'] * 1e3:6.1f} ms{shown}",  # type: ignore[operator]
            flush=True,
        )
    for made in clients:
        made.flush()
        for table in made.data_name_list():
            made.delete_data(table)
        made.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="batches a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=float, default=0.25, help="cache rows / table rows")
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--workloads", nargs="+",
        default=[tw.WORKLOADS[0].name, tw.WORKLOADS[1].name, FIXED],
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "cache_step_bench.json"
    )
    args = parser.parse_args()
    report: dict[str, object] = {
        "machine": platform.platform(), "tables": TABLES, "rows": ROWS, "dim": DIM,
        "batch": BATCH, "cache": args.cache, "steps": args.steps, "rounds": args.rounds,
        # one step's distinct rows of a uniform batch, about 95% of 8 x 20480
        "conversion": conversion(TABLES * 19_500),
    }  # fmt: skip
    print("conversion of one step's rows:", report["conversion"], flush=True)
    wire = WireBytes()
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as root:
        processes: list[subprocess.Popen[bytes]]
        processes, addresses = cache_bench._start_nodes(Path(root), 2)
        try:
            for name in args.workloads:
                results += run_workload(args, name, addresses, [p.pid for p in processes], wire)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=60)
    report["train_step"] = results
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
