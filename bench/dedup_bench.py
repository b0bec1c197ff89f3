"""What naming updates costs: update throughput with request ids against without, paired.

One in-process PS node (checkpoint durability, CPU) and one table; the same
pre-made gradients are sent as Update and as MultiUpdate (two tables) calls on
raw channels, in alternating rounds with and without a request id, so both
sides see the same machine load. A named call pays what exactly-once costs:
the client appending the id, the node reading it, digesting the update
content, the de-dup window's bookkeeping and the slots the keys touch. Prints
a table (median calls/s per side and their ratio; median CPU time per call of
the whole process, client and node, and its ratio: steadier than wall-clock
time on a shared machine; of the named calls' CPU, the client's naming alone,
which copies the whole body once more) and writes bench/results/dedup_bench.json.

Usage: python bench/dedup_bench.py [--keys 1024] [--dim 64] [--calls 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

from recstore.client.remote.backend import GrpcBackend
from recstore.core import TableSpec, wire
from recstore.core.request_id import RequestIds, with_request_id
from recstore.ps.serve.server import start_in_thread

ROOT = Path(__file__).resolve().parent.parent


def _spec(name: str, dim: int, rows: int) -> TableSpec:
    return TableSpec.model_validate({
        "name": name, "num_embeddings": rows, "embedding_dim": dim,
        "optimizer": {"kind": "sgd", "lr": 0.01}, "initializer": {"kind": "zeros"},
    })  # fmt: skip


def _bodies(method: str, keys: np.ndarray, grads: np.ndarray) -> bytes:
    if method == "Update":
        return wire.encode_update_request("a", keys, grads, dim=grads.shape[1])
    items = [
        wire.UpdateRequest(name, 0, keys.data, grads.data, "float32", None, grads.shape[1])
        for name in ("a", "b")
    ]
    return wire.encode_multi_update_request(items)


def _round(call: grpc.UnaryUnaryMultiCallable, method: str, body: bytes, calls: int,
           ids: RequestIds | None) -> tuple[float, float, float]:  # fmt: skip
    """(calls/s, CPU microseconds per call of this process: client and node together,
    of which naming the request on the client)."""
    started, cpu, naming = time.perf_counter(), time.process_time(), 0.0
    for _ in range(calls):
        request = body
        if ids is not None:
            named_at = time.process_time()
            request = with_request_id(method, body, ids.next())
            naming += time.process_time() - named_at
        call(request, timeout=60)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return calls / wall, cpu / calls * 1e6, naming / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = 100_000
    keys = rng.choice(rows, args.keys, replace=False).astype("<i8")
    grads = rng.standard_normal((args.keys, args.dim)).astype("<f4")
    results = []
    with tempfile.TemporaryDirectory() as data_dir:
        handle = start_in_thread(data_dir=data_dir)
        try:
            backend = GrpcBackend(endpoints=(handle.address,), rpc_timeout=60)
            for name in ("a", "b"):
                backend.create_table(_spec(name, args.dim, rows))
            backend.close()
            channel = grpc.insecure_channel(handle.address)
            for method, path in (("Update", wire.UPDATE), ("MultiUpdate", wire.MULTI_UPDATE)):
                call = channel.unary_unary(path)
                body = _bodies(method, keys, grads)
                ids = RequestIds()
                _round(call, method, body, 20, None)  # warm up both paths
                _round(call, method, body, 20, ids)
                plain, named = [], []
                for _ in range(args.rounds):
                    plain.append(_round(call, method, body, args.calls, None))
                    named.append(_round(call, method, body, args.calls, ids))
                ratios = [n[0] / p[0] for n, p in zip(named, plain, strict=True)]
                cpu_ratios = [n[1] / p[1] for n, p in zip(named, plain, strict=True)]
                results.append({
                    "method": method, "keys": args.keys, "dim": args.dim,
                    "plain_calls_per_s": statistics.median(p[0] for p in plain),
                    "named_calls_per_s": statistics.median(n[0] for n in named),
                    "ratio_median": statistics.median(ratios),
                    "plain_cpu_us_per_call": statistics.median(p[1] for p in plain),
                    "named_cpu_us_per_call": statistics.median(n[1] for n in named),
                    "cpu_ratio_median": statistics.median(cpu_ratios),
                    "client_naming_cpu_us_per_call": statistics.median(n[2] for n in named),
                })  # fmt: skip
            channel.close()
        finally:
            handle.stop(final_checkpoint=False)
    print(
        f"{'method':<12} {'keys x dim':>11} {'plain/s':>9} {'named/s':>9} {'thr ratio':>10} "
        f"{'plain cpu us':>13} {'named cpu us':>13} {'cpu ratio':>10} {'naming us':>10}"
    )
    for r in results:
        shape = f"{r['keys']}x{r['dim']}"
        print(
            f"{r['method']:<12} {shape:>11} {r['plain_calls_per_s']:9.0f} "
            f"{r['named_calls_per_s']:9.0f} {r['ratio_median']:10.3f} "
            f"{r['plain_cpu_us_per_call']:13.0f} {r['named_cpu_us_per_call']:13.0f} "
            f"{r['cpu_ratio_median']:10.3f} {r['client_naming_cpu_us_per_call']:10.0f}"
        )
    out = ROOT / "bench" / "results" / "dedup_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
