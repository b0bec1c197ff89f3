"""A trainer's step over gRPC with and without the SDK's malloc tuning.

The SDK's gRPC backend tunes glibc's malloc once per process
(``recstore.core.malloc_tuning``; ``RECSTORE_MALLOC_TUNING=0`` leaves it as it
is). malloc's settings are the whole process's and glibc adapts its own
thresholds to what a process has freed, so the two ways cannot alternate in one
process: each run is a child process of its own, the two ways taking turns,
``--runs`` of each. A child starts two PS nodes (``cache_bench``'s launcher)
and steps ``cache_step_bench``'s fixed-popularity workload (8 tables of 200k x
64, batch 2048, 10 ids a bag, row-wise Adagrad) with two models in turns: the
fp32 ``EmbeddingBagCollection`` and the bf16 ``NVEmbeddingBagCollection`` with a
25% host cache at ``max_staleness_steps=4``. Per model: the median step, the
trainer's CPU and minor page faults a step, and the process's peak resident
memory.

Prints a table and writes bench/results/malloc_bench.json.

Usage: python bench/malloc_bench.py [--runs 3] [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from processes import write_report  # noqa: E402

WAYS = {"untuned": "0", "tuned": "1"}  # RECSTORE_MALLOC_TUNING in the child
MODELS = ("fp32, no cache", "bf16 + cache k=4, collection")


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def child(steps: int) -> dict[str, object]:
    """One run in this process: both models stepped in turns; figures per model."""
    import cache_bench
    import cache_step_bench as csb
    import tbe_workloads as tw

    from recstore.client import RecStoreClient

    with tempfile.TemporaryDirectory() as root:
        processes, addresses = cache_bench._start_nodes(Path(root), 2)
        try:
            work, data = csb.workload_batches(csb.FIXED, steps + 3)
            fp32 = RecStoreClient(role="malloc-fp32")
            fp32.set_ps_endpoints(addresses)
            bf16 = RecStoreClient(role="malloc-bf16")
            bf16.set_ps_endpoints(addresses)
            bf16.set_transport_dtype("bfloat16")
            cache_rows = csb.ROWS // 4
            models = {
                MODELS[0]: tw.RecStoreBags(fp32, work, [csb.ROWS] * csb.TABLES, csb.DIM),
                MODELS[1]: csb.NveBags(bf16, work, 4, cache_rows, True),
            }
            for model in models.values():  # warm-up: tables touched, caches filled
                for batch in data[:3]:
                    tw.step(model, None, batch)
            times: dict[str, list[float]] = {name: [] for name in models}
            cpu = dict.fromkeys(models, 0.0)
            faults = dict.fromkeys(models, 0)
            for batch in data[3:]:
                for name, model in models.items():
                    faults_before = _minor_faults()
                    cpu_before, started = time.process_time(), time.perf_counter()
                    tw.step(model, None, batch)
                    times[name].append(time.perf_counter() - started)
                    cpu[name] += time.process_time() - cpu_before
                    faults[name] += _minor_faults() - faults_before
            for client in (fp32, bf16):
                client.flush()
                for table in client.data_name_list():
                    client.delete_data(table)
                client.close()
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=60)
    return {
        "models": {
            name: {
                "median_step_s": statistics.median(times[name]),
                "cpu_s_per_step": cpu[name] / steps,
                "faults_per_step": faults[name] / steps,
            }
            for name in models
        },
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run(way: str, steps: int) -> dict[str, object]:
    env = {**os.environ, "RECSTORE_MALLOC_TUNING": WAYS[way]}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--steps", str(steps)], env=env,
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="child processes each way")
    parser.add_argument("--steps", type=int, default=12, help="timed steps a model and run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "malloc_bench.json"
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.steps)))
        return 0
    runs: dict[str, list[dict[str, object]]] = {way: [] for way in WAYS}
    for _ in range(args.runs):
        for way in WAYS:  # in turns: a slow stretch of the machine lands on both
            runs[way].append(run(way, args.steps))
    print(f"{'model':32}{'way':>10}{'median step ms':>16}{'CPU ms/step':>13}"
          f"{'faults/step':>13}{'peak RSS MB':>13}")  # fmt: skip
    for name in MODELS:
        for way in WAYS:
            for figures in runs[way]:
                model = figures["models"][name]  # type: ignore[index]
                print(
                    f"{name:32}{way:>10}{model['median_step_s'] * 1e3:>16.1f}"
                    f"{model['cpu_s_per_step'] * 1e3:>13.1f}{model['faults_per_step']:>13.0f}"
                    f"{figures['peak_rss_mb']:>13.0f}"
                )
    write_report(args.out, {"steps": args.steps, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
