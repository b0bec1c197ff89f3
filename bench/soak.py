"""Soak: many clients pulling and updating a 2-shard table on the local platform.

Starts the whole platform in-process (admin API on SQLite, two PS node
processes on loopback, as `recstore up` does), creates one table, then runs
``--clients`` threads — each its own RecStoreClient and gRPC channels — in a
mixed loop (3 pulls : 1 update, random ids) for ``--seconds``. Every row is
created before the clock starts, and the first ``--warm-seconds`` under load are
not sampled (connections, the nodes' threads and their allocator arenas grow
then: about 10 MiB over 2 nodes, the same after 8 s as after 30 s); then the
nodes' resident memory is sampled every second, and the report gives requests,
rows, errors, latency percentiles and memory drift (mean RSS of the last quarter
of the run over the first quarter), which would only grow with a leak. Bounded
in time; stops by itself.

    python bench/soak.py [--clients 32 --seconds 60 --batch 1024]

Prints a table and writes bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import torch

from recstore import RecStoreClient
from recstore.local.platform import LocalPlatform

ROOT = Path(__file__).resolve().parents[1]
TABLE = "soak"


@dataclass
class Tally:
    requests: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _worker(
    platform: LocalPlatform, index: int, args: argparse.Namespace, stop: threading.Event
) -> Tally:
    tally = Tally()
    client = RecStoreClient(role=f"soak-{index}")
    client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
    client.init_data(TABLE, (args.rows, args.dim), torch.float32)
    rng = np.random.default_rng(index)
    try:
        while not stop.is_set():
            ids = torch.from_numpy(rng.integers(0, args.rows, args.batch))
            started = time.perf_counter()
            try:
                if tally.requests % 4 == 3:
                    client.update(TABLE, ids, torch.randn(args.batch, args.dim))
                else:
                    client.pull(TABLE, ids)
            except Exception as error:  # every failure counts; the soak must see none
                tally.errors.append(f"{type(error).__name__}: {error}")
                continue
            tally.latencies.append(time.perf_counter() - started)
            tally.requests += 1
            tally.rows += args.batch
    finally:
        client.close()
    return tally


def _warm_up(platform: LocalPlatform, args: argparse.Namespace) -> None:
    """Create every row first: memory growth during the soak then means a leak, not data."""
    client = RecStoreClient(role="soak-warm-up")
    client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
    client.init_data(TABLE, (args.rows, args.dim), torch.float32)
    for start in range(0, args.rows, 65536):
        ids = torch.arange(start, min(args.rows, start + 65536))
        client.update(TABLE, ids, torch.zeros(len(ids), args.dim))  # creates optimizer state too
    client.close()


def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="recstore-soak-") as state:
        platform = LocalPlatform(Path(state), port=0, poll_interval=0.5)
        platform.start()
        try:
            headers = {"Authorization": f"Bearer {platform.token}"}
            spec = {
                "name": TABLE,
                "numEmbeddings": args.rows,
                "embeddingDim": args.dim,
                "shards": 2,
                "optimizer": {"kind": "adagrad", "lr": 0.01},
            }
            httpx.post(
                f"{platform.url}/api/v1/tables", json=spec, headers=headers
            ).raise_for_status()
            deadline = time.monotonic() + 60
            while platform.provisioner.status(TABLE).get("phase") != "Ready":
                if time.monotonic() > deadline:
                    raise RuntimeError("the soak table did not become Ready")
                time.sleep(0.1)
            pids = [platform.provisioner.node_pid(TABLE, shard) for shard in range(2)]
            _warm_up(platform, args)

            stop = threading.Event()
            tallies: list[Tally] = [Tally() for _ in range(args.clients)]

            def work(i: int) -> None:
                tallies[i] = _worker(platform, i, args, stop)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(args.clients)]
            for thread in threads:
                thread.start()
            samples: list[int] = []
            started = time.monotonic()
            # the first seconds under load (connections, the nodes' threads and their
            # arenas, the de-dup windows filling) are warm-up, not a leak: not sampled
            while time.monotonic() - started < args.warm_seconds + args.seconds:
                if time.monotonic() - started >= args.warm_seconds:
                    samples.append(sum(_rss_bytes(pid) for pid in pids))
                time.sleep(1.0)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            elapsed = time.monotonic() - started
            restarts = [platform.provisioner.node_restarts(TABLE, s) for s in range(2)]
        finally:
            platform.stop()

    latencies = sorted(x for t in tallies for x in t.latencies)
    quarter = max(1, len(samples) // 4)
    first, last = statistics.mean(samples[:quarter]), statistics.mean(samples[-quarter:])
    errors = [e for t in tallies for e in t.errors]
    return {
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "batch": args.batch,
        "requests": sum(t.requests for t in tallies),
        "requests_per_s": round(sum(t.requests for t in tallies) / elapsed, 1),
        "rows_per_s": round(sum(t.rows for t in tallies) / elapsed),
        "errors": len(errors),
        "first_errors": errors[:5],
        "latency_p50_ms": round(1e3 * latencies[len(latencies) // 2], 2) if latencies else None,
        "latency_p99_ms": round(1e3 * latencies[int(len(latencies) * 0.99)], 2)
        if latencies
        else None,
        "rss_first_quarter_mib": round(first / 2**20, 1),
        "rss_last_quarter_mib": round(last / 2**20, 1),
        "rss_drift": round(last / first - 1, 4),
        "node_restarts": restarts,
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60, help="measured seconds")
    parser.add_argument(
        "--warm-seconds", type=float, default=3, help="seconds under load before RSS is sampled"
    )
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/soak.json")
    args = parser.parse_args(argv)
    result = run(args)
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
