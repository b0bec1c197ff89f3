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

4. The multi-hot training step over gRPC (``train_step``): the fp32 collection
   without a cache against bf16 transport, and bf16 ``NVEmbeddingBag`` layers
   with a host cache and ``max_staleness_steps`` k; ratios of median steps in
   this run. Target: bf16 + cache <= 0.6x of fp32 uncached.

Prints tables and writes bench/results/cache_bench.json.

Usage: python bench/cache_bench.py [--trace 4000000] [--batch 4096] [--window 0.5]
       [--skip-hit-rates] [--skip-remote] [--skip-staleness] [--skip-train]
       [--dims 32 128] [--batches 4096 16384]
       [--remote-warm 16000000] [--remote-trace 400000] [--rounds 5]
"""

from __future__ import annotations

import argparse
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
from cache_hit_bench import ROWS, hit_rates

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))


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


# -- the multi-hot training step over gRPC --------------------------------------------
class NveBags(torch.nn.Module):
    """``tbe_workloads.RecStoreBags``'s tables as ``NVEmbeddingBag`` layers with a host cache
    whose rows serve at most ``k`` steps (``max_staleness_steps``)."""

    def __init__(self, client: object, work: object, shape: tuple[int, int, int], k: int,
                 cache_rows: int) -> None:  # fmt: skip
        import recstore.nve as nve
        from recstore.client.host_cache import bytes_per_row

        super().__init__()
        tables, rows, dim = shape
        prefix = f"nve_{uuid.uuid4().hex[:8]}"
        config = {"host_cache_size": cache_rows * bytes_per_row(dim * 4), "max_staleness_steps": k}
        self.bags = torch.nn.ModuleList(
            nve.NVEmbeddingBag(
                rows, dim, storage=nve.RemoteTable(
                    client, f"{prefix}_{i}",  # type: ignore[arg-type]
                    optimizer={"kind": work.optimizer, "lr": work.lr, "eps": 1e-8},  # type: ignore[attr-defined]
                    initializer={"kind": "uniform", "low": -0.05, "high": 0.05, "seed": i},
                ), device="cpu", config=config,
            )
            for i in range(tables)
        )  # fmt: skip

    def forward(self, ids: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([bag(x) for bag, x in zip(self.bags, ids, strict=True)], dim=1)


def train_step(args: argparse.Namespace) -> list[dict[str, object]]:
    """Median step times of the multi-hot step (``tbe_workloads``: 8 tables of 200k x 64,
    batch 2048, 10 ids a bag) over gRPC to two nodes: the fp32 collection without a cache
    (the baseline), the same with bf16 transport, and bf16 ``NVEmbeddingBag`` layers with a
    host cache of ``--train-cache`` of the rows for each ``--train-staleness`` k; the
    variants interleaved round by round, each one's ratio to the baseline in this run."""
    sys.path.insert(0, str(ROOT / "bench"))
    import tbe_workloads as tw

    from recstore.client import RecStoreClient

    shape = (8, 200_000, 64)
    results = []
    with tempfile.TemporaryDirectory() as root:
        processes, addresses = _start_nodes(Path(root), 2)
        try:
            for work in tw.WORKLOADS[:2]:  # uniform ids with SGD, Zipf(1.05) with row-wise Adagrad
                clients: list[RecStoreClient] = []

                def client(
                    transport: str | None, clients: list[RecStoreClient] = clients
                ) -> RecStoreClient:
                    made = RecStoreClient(role=f"train_{uuid.uuid4().hex[:8]}")
                    made.set_ps_endpoints(addresses)
                    if transport is not None:
                        made.set_transport_dtype(transport)
                    clients.append(made)
                    return made

                variants: dict[str, torch.nn.Module] = {
                    "fp32, no cache": tw.RecStoreBags(client(None), work, *shape),
                    "bf16, no cache": tw.RecStoreBags(client("bfloat16"), work, *shape),
                }
                cache_rows = int(shape[1] * args.train_cache)
                for k in args.train_staleness:
                    variants[f"bf16 + cache k={k}"] = NveBags(
                        client("bfloat16"), work, shape, k, cache_rows
                    )
                data = tw.batches(work, *shape[:2], 2048, shape[2], args.train_steps)
                for model in variants.values():  # warm-up: every row resident, caches filled
                    for batch in data:
                        tw.step(model, None, batch)
                times: dict[str, list[float]] = {label: [] for label in variants}
                for _ in range(args.train_rounds):
                    for label, model in variants.items():
                        for batch in data:
                            started = time.perf_counter()
                            tw.step(model, None, batch)
                            times[label].append(time.perf_counter() - started)
                medians = {label: float(np.median(t)) for label, t in times.items()}
                base = medians["fp32, no cache"]
                for label, median in medians.items():
                    model = variants[label]
                    hit = (
                        model.bags[0].cache_stats().get("hit_rate")
                        if isinstance(model, NveBags)
                        else None
                    )
                    results.append({
                        "workload": work.name, "variant": label, "median_step_s": median,
                        "vs_fp32_uncached": median / base, "hit_rate_table_0": hit,
                    })  # fmt: skip
                    shown = "" if hit is None else f"  hit rate {hit:.3f}"
                    print(f"train {work.name:22} {label:18} {median * 1e3:8.1f} ms  "
                          f"{median / base:5.2f}x of fp32 uncached{shown}", flush=True)  # fmt: skip
                for made in clients:
                    made.flush()
                    for table in made.data_name_list():
                        made.delete_data(table)
                    made.close()
                del variants
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=60)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--skip-remote", action="store_true")
    parser.add_argument("--skip-hit-rates", action="store_true")
    parser.add_argument("--skip-staleness", action="store_true")
    parser.add_argument("--skip-train", action="store_true", help="no multi-hot training step")
    parser.add_argument("--train-steps", type=int, default=3, help="batches a round")
    parser.add_argument("--train-rounds", type=int, default=3)
    parser.add_argument("--train-cache", type=float, default=0.25, help="cache rows / table rows")
    parser.add_argument("--train-staleness", type=int, nargs="+", default=[1, 4])
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
    if not args.skip_train:
        report["train_step"] = train_step(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
