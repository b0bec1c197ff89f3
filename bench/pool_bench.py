"""A pool of 2 nodes holding the 26 Criteo Kaggle tables against 26 one-shard fleets, on
`recstore up`, in one run.

Both layouts run side by side on one platform (the admin API and the local provisioner
in this process): 26 tables (dim 16, the Kaggle cardinalities scaled to fit) on the pool
``criteo`` of 2 nodes, and the same 26 tables each with a node of its own. Measured:
node processes; the nodes' RSS against the tables' own bytes (what the engine reports
holding) plus 150 MiB per node; the time from the last apply until all 26 are Ready; and
the training step (a collection over the 26 tables, batch 2048, skewed ids, forward and
backward) through the admin URL, over an endpoint list to the same pool nodes, and over
the per-table fleets. The three take turns of a few steps (``BLOCK_TIMED``), each turn
ending with its client's updates settled, so load on the shared machine lands on all of
them; the figures are medians and ratios of medians.

    python bench/pool_bench.py --out artifacts/bench/pool_bench.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from criteo_pool import skewed_ids, table_specs
from processes import write_report

import recstore.nn as rnn
from recstore import RecStoreClient
from recstore.local.platform import LocalPlatform
from recstore.local.shard_client import ShardClient

NODE_MIB = 150
#: timed steps per turn of a variant: the pool's two clients share its nodes, so each takes
#: turns of a few steps and settles its updates before the other's turn (step by step,
#: one client's held updates would land on the nodes during the other's step)
BLOCK_TIMED = 4


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def apply_and_wait(api: httpx.Client, specs: list[dict[str, Any]]) -> float:
    """POST every table; seconds from the last apply until all are Ready."""
    for spec in specs:
        api.post("/tables", json=spec).raise_for_status()
    applied = time.perf_counter()
    names = {str(s["name"]) for s in specs}
    while True:
        items = api.get("/tables", params={"limit": 500}).json()["items"]
        if all(t["status"].get("phase") == "Ready" for t in items if t["name"] in names):
            return time.perf_counter() - applied
        if time.perf_counter() - applied > 600:
            raise RuntimeError("tables not Ready after 600 s")
        time.sleep(0.05)


def held_bytes(endpoints: list[str], names: list[str], token: str) -> int:
    """What the engine reports holding for ``names`` on the nodes at ``endpoints``."""
    total = 0
    for endpoint in endpoints:
        node = ShardClient(endpoint, token=token, timeout=10.0)
        for name in names:
            stats = node.stats(name)
            total += stats.memory_bytes if stats is not None else 0
        node.close()
    return total


def collection(client: RecStoreClient, specs: list[dict[str, Any]]) -> Any:
    return rnn.EmbeddingBagCollection([
        rnn.EmbeddingBag(int(s["numEmbeddings"]), int(s["embeddingDim"]), mode="sum",
                         name=str(s["name"]), client=client)
        for s in specs
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-rows", type=int, default=1_700_000)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench/pool_bench.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pool-bench-") as state:
        platform = LocalPlatform(Path(state), port=0, poll_interval=0.1)
        platform.start()
        try:
            report = run(platform, args)
        finally:
            platform.stop()
    print_table(report)
    write_report(args.out, report)


def run(platform: LocalPlatform, args: argparse.Namespace) -> dict[str, Any]:
    api = httpx.Client(base_url=f"{platform.url}/api/v1", timeout=60,
                       headers={"Authorization": f"Bearer {platform.token}"})  # fmt: skip
    pool = {"name": "criteo", "shards": 2, "placement": {"resources": {"memory": "2Gi"}}}
    api.post("/pools", json=pool).raise_for_status()
    pooled = table_specs(args.total_rows, 16, "criteo")
    own = [{k: v for k, v in s.items() if k != "pool"} | {"name": f"own-{s['name']}",
                                                          "shards": 1} for s in pooled]  # fmt: skip
    ready_pool = apply_and_wait(api, pooled)
    ready_own = apply_and_wait(api, own)
    provisioner, token = platform.provisioner, platform.ps_token
    pool_endpoints = provisioner.pool_endpoints("criteo")
    pool_pids = [provisioner.pool_node_pid("criteo", i) for i in range(2)]
    own_pids = [provisioner.node_pid(str(s["name"]), 0) for s in own]

    clients = {}
    for variant in ("pool via admin URL", "pool via endpoint list", "per-table fleets"):
        client = RecStoreClient(role=f"pool-bench-{len(clients)}")
        if variant == "pool via endpoint list":
            client.set_ps_endpoints(pool_endpoints, ps_token=token)
        else:
            client.set_admin_url(platform.url, platform.token, ps_token=token)
        clients[variant] = (client, collection(client, own if variant == "per-table fleets"
                                                 else pooled))  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {name: [] for name in clients}
    for block in range(-1, -(-args.steps // BLOCK_TIMED)):  # block -1 warms every variant
        order = list(clients)[block % 3 :] + list(clients)[: block % 3]
        for name in order:
            client, bags = clients[name]
            for step in range(BLOCK_TIMED + 1):
                features = [skewed_ids(int(s["numEmbeddings"]), args.batch, generator)
                            for s in pooled]  # fmt: skip
                started = time.perf_counter()
                torch.cat(bags(features), dim=1).sum().backward()
                if block >= 0 and step > 0:  # a block's first step carries nothing yet
                    times[name].append(time.perf_counter() - started)
            client.flush()  # nothing of this client in flight during the next one's steps
    for client, _ in clients.values():
        client.close()

    names = [str(s["name"]) for s in pooled]
    pool_held = held_bytes(pool_endpoints, names, token)
    own_held = sum(held_bytes([provisioner.endpoints(str(s["name"]))[0]], [str(s["name"])], token)
                   for s in own)  # fmt: skip
    step_ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    admin, listed = step_ms["pool via admin URL"], step_ms["pool via endpoint list"]
    layouts = {
        "pool": {"processes": len(pool_pids), "rss_bytes": sum(map(rss_bytes, pool_pids)),
                 "tables_bytes": pool_held, "ready_s": ready_pool},
        "per-table": {"processes": len(own_pids), "rss_bytes": sum(map(rss_bytes, own_pids)),
                      "tables_bytes": own_held, "ready_s": ready_own},
    }  # fmt: skip
    for layout in layouts.values():
        allowed = 1.25 * layout["tables_bytes"] + NODE_MIB * 2**20 * layout["processes"]
        layout["rss_over_allowed"] = layout["rss_bytes"] / allowed
    return {
        "tables": len(pooled), "rows": sum(int(s["numEmbeddings"]) for s in pooled),
        "dim": 16, "batch": args.batch, "steps": args.steps,
        "layouts": layouts, "step_ms": step_ms,
        "ratios": {"admin_over_endpoint_list": admin / listed,
                   "admin_over_per_table": admin / step_ms["per-table fleets"]},
        "targets": {"processes": layouts["pool"]["processes"] <= 2,
                    "rss": layouts["pool"]["rss_over_allowed"] <= 1.0,
                    "ready_within_10s": ready_pool <= 10.0,
                    "step_vs_endpoint_list": admin / listed <= 1.1,
                    "step_vs_per_table": admin / step_ms["per-table fleets"] <= 0.35},
    }  # fmt: skip


def print_table(report: dict[str, Any]) -> None:
    mib = 2**20
    print(f"{report['tables']} tables, {report['rows']} rows, dim {report['dim']}, "
          f"batch {report['batch']}, {report['steps']} timed steps (medians)")  # fmt: skip
    print(f"{'layout':<12}{'processes':>10}{'RSS MiB':>10}{'tables MiB':>12}"
          f"{'RSS/allowed':>13}{'Ready s':>9}")  # fmt: skip
    for name, layout in report["layouts"].items():
        print(f"{name:<12}{layout['processes']:>10}{layout['rss_bytes'] / mib:>10.1f}"
              f"{layout['tables_bytes'] / mib:>12.1f}{layout['rss_over_allowed']:>13.2f}"
              f"{layout['ready_s']:>9.2f}")  # fmt: skip
    for name, ms in report["step_ms"].items():
        print(f"step {name:<24}{ms:>9.2f} ms")
    for name, ratio in report["ratios"].items():
        print(f"{name:<30}{ratio:>7.3f}")
    print("targets met: " + ", ".join(f"{k}={v}" for k, v in report["targets"].items()))


if __name__ == "__main__":
    main()
