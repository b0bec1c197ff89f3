"""The 26 categorical features of the Criteo Kaggle DLRM as 26 tables on one pool.

A real recommendation model has one table per categorical feature. Here each of the
26 Criteo Kaggle features gets its own table (its cardinality scaled to fit this
machine), all placed on the pool ``criteo`` of two PS nodes: two node processes hold
all 26 tables, and a training step sends one request per node for all of them.

    recstore up &
    python examples/criteo_pool.py --admin-url http://127.0.0.1:8080 --steps 100

The pool and the tables are created through the admin API (as `recstore apply -f` of an
EmbeddingPool and 26 EmbeddingTables with ``spec.pool: criteo`` would), then a small
model trains over the collection of the 26 tables.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import httpx
import torch

import recstore.nn as rnn
from recstore import RecStoreClient

#: the Criteo Kaggle (DAC) cardinalities of C1..C26, as the DLRM reference reads them
CRITEO_KAGGLE = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip


def scaled(total_rows: int) -> list[int]:
    """The cardinalities scaled so that they sum to about ``total_rows``; a small one (up to
    1000 rows) is kept whole."""
    factor = total_rows / sum(CRITEO_KAGGLE)
    return [max(min(c, 1000), round(c * factor)) for c in CRITEO_KAGGLE]


def table_specs(total_rows: int, dim: int, pool: str) -> list[dict[str, object]]:
    return [
        {"name": f"criteo-c{i + 1}", "numEmbeddings": rows, "embeddingDim": dim, "pool": pool,
         "initializer": {"kind": "normal", "std": 0.01, "seed": i},
         "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}
        for i, rows in enumerate(scaled(total_rows))
    ]  # fmt: skip


def skewed_ids(rows: int, batch: int, generator: torch.Generator) -> torch.Tensor:
    """Ids where a few rows are most of the traffic, as in click logs (u**3 of a uniform u)."""
    u = torch.rand(batch, 1, generator=generator)
    return (u**3 * rows).long().clamp_(max=rows - 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default=os.environ.get("RECSTORE_ADMIN_URL"))
    parser.add_argument("--state-dir", type=Path, default=Path.home() / ".recstore")
    parser.add_argument("--total-rows", type=int, default=1_700_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    if not args.admin_url:
        parser.error("--admin-url (or RECSTORE_ADMIN_URL) is required")
    token = os.environ.get("RECSTORE_TOKEN") or (args.state_dir / "admin-token").read_text()
    ps_token = os.environ.get("RECSTORE_PS_TOKEN") or (args.state_dir / "ps-token").read_text()
    api = httpx.Client(
        base_url=f"{args.admin_url}/api/v1", timeout=30,
        headers={"Authorization": f"Bearer {token.strip()}"},
    )  # fmt: skip
    if api.get("/pools/criteo").status_code == 404:
        pool = {"name": "criteo", "shards": 2, "placement": {"resources": {"memory": "2Gi"}}}
        api.post("/pools", json=pool).raise_for_status()
    specs = table_specs(args.total_rows, args.dim, "criteo")
    for spec in specs:
        if api.get(f"/tables/{spec['name']}").status_code == 404:
            api.post("/tables", json=spec).raise_for_status()
    deadline = time.monotonic() + 120
    while any(api.get(f"/tables/{s['name']}").json()["status"].get("phase") != "Ready"
              for s in specs):  # fmt: skip
        if time.monotonic() > deadline:
            raise SystemExit("the tables did not become Ready in 120 s")
        time.sleep(0.2)
    pool = api.get("/pools/criteo").json()
    print(f"pool criteo: {len(pool['tables'])} tables on {pool['spec']['shards']} nodes")

    client = RecStoreClient(role="criteo-pool")
    client.set_admin_url(args.admin_url, token.strip(), ps_token=ps_token.strip())
    bags = [
        rnn.EmbeddingBag(int(s["numEmbeddings"]), args.dim, mode="sum", name=str(s["name"]),
                         client=client)
        for s in specs
    ]  # fmt: skip
    collection = rnn.EmbeddingBagCollection(bags)
    top = torch.nn.Sequential(torch.nn.Linear(26 * args.dim, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 1))  # fmt: skip
    optimizer = torch.optim.Adagrad(top.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(args.steps):
        features = [skewed_ids(int(s["numEmbeddings"]), args.batch, generator) for s in specs]
        # a synthetic click: whether the first two features' ids fall in their hot tenth
        clicks = ((features[0] * 10 < int(specs[0]["numEmbeddings"]))
                  & (features[1] * 10 < int(specs[1]["numEmbeddings"]))).float()  # fmt: skip
        logits = top(torch.cat(collection(features), dim=1))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    quarter = max(1, len(losses) // 4)
    first, last = sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter
    print(f"loss {first:.4f} -> {last:.4f} over {args.steps} steps")
    client.close()


if __name__ == "__main__":
    main()
