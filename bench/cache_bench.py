"""The host cache against the offline optimum, remote lookups with and without it, staleness.

1. Hit rate against Belady's MIN, per distinct id and per id, from cold and
   warm, at caches of 1/5/10/25% of 10M rows: ``bench/cache_hit_bench.py``
   (also runnable alone). Target: >= 0.9x MIN at every size.
2. Remote inference lookups/s at alpha 1.05 with a host cache of 10% of the rows
   against none, per dim and batch size, and where each lookup's time goes:
   ``bench/cache_remote_bench.py`` (also runnable alone). Target: >= 3x.
3. Staleness: the DLRM demo model (examples/dlrm_synthetic.py) trained 300
   steps with ``NVEmbeddingBag`` layers, exact and with max_staleness_steps
   k = 0, 1, 4 (same data and seeds): the final loss of each.

The multi-hot training step over gRPC with bf16 transport and the cache is
``bench/cache_step_bench.py``.

Prints tables and writes bench/results/cache_bench.json.

Usage: python bench/cache_bench.py [--trace 4000000] [--batch 4096] [--window 0.5]
       [--skip-hit-rates] [--skip-remote] [--skip-staleness]
       [--dims 32 128] [--batches 4096 16384]
       [--remote-warm 16000000] [--remote-trace 400000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import torch
from cache_hit_bench import ROWS, hit_rates
from processes import free_port, write_report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))


# -- remote lookups/s -----------------------------------------------------------------
def _start_nodes(root: Path, shards: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    import grpc

    processes, addresses = [], []
    for index in range(shards):
        port = free_port()
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


def remote(args: argparse.Namespace) -> list[dict[str, object]]:
    """Section 2, run by ``bench/cache_remote_bench.py`` (its ``--dims`` and ``--batches``)."""
    import cache_remote_bench

    return cache_remote_bench.remote(args)


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
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--skip-remote", action="store_true")
    parser.add_argument("--skip-hit-rates", action="store_true")
    parser.add_argument("--skip-staleness", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cache_bench.json")
    import cache_hit_bench
    import cache_remote_bench

    cache_hit_bench.add_arguments(parser)
    cache_remote_bench.add_arguments(parser)
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
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
