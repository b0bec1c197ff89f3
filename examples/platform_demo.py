"""Train the DLRM-style example against a running RecStore platform.

The 8 sparse features share one sharded table (see
examples/tables/demo-clicks.yaml): each feature's bag looks its ids up at its
own offset, so a single `recstore.nn.EmbeddingBag` — whose backward sends the
sparse gradients to the table's server-side optimizer — serves them all. The
shards are found through the admin API.

    recstore up &
    recstore apply -f examples/tables/demo-clicks.yaml
    python examples/platform_demo.py --admin-url http://127.0.0.1:8080 --steps 300
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dlrm_synthetic import DLRM, INIT_RANGE, DataConfig, SyntheticClicks, train

import recstore.nn as rnn
from recstore import RecStoreClient


class FeatureBag(nn.Module):
    """One feature's view of a shared table: its ids shifted to the feature's range."""

    def __init__(self, shared: rnn.EmbeddingBag, offset: int) -> None:
        super().__init__()
        self.shared = shared
        self.offset = offset

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.shared(ids + self.offset, offsets)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default=os.environ.get("RECSTORE_ADMIN_URL"))
    parser.add_argument("--token-file", type=Path, default=Path.home() / ".recstore/admin-token")
    parser.add_argument("--ps-token-file", type=Path, default=Path.home() / ".recstore/ps-token")
    parser.add_argument("--table", default="demo-clicks")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--num-features", type=int, default=8)
    parser.add_argument("--cardinality", type=int, default=100_000)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args(argv)
    if not args.admin_url:
        parser.error("--admin-url (or RECSTORE_ADMIN_URL) is required")
    token = os.environ.get("RECSTORE_TOKEN") or args.token_file.read_text().strip()
    ps_token = os.environ.get("RECSTORE_PS_TOKEN") or args.ps_token_file.read_text().strip()

    client = RecStoreClient(role="platform-demo")
    client.set_admin_url(args.admin_url, token, ps_token=ps_token)
    rows = args.num_features * args.cardinality
    shared = rnn.EmbeddingBag(
        rows, args.embedding_dim, mode="sum", name=args.table, client=client,
        initializer={"kind": "uniform", "low": -INIT_RANGE, "high": INIT_RANGE},
    )  # fmt: skip
    torch.manual_seed(0)
    data = DataConfig(args.num_features, args.cardinality)
    model = DLRM(data, args.embedding_dim, lambda i, n, d: FeatureBag(shared, i * n))
    losses = train(model, SyntheticClicks(data), args.steps, args.lr)
    window = max(1, min(20, len(losses) // 4))
    quarters = [losses[i * len(losses) // 4 : (i + 1) * len(losses) // 4] for i in range(4)]
    curve = "  ".join(f"{sum(q) / len(q):.4f}" for q in quarters if q)
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    print(f"loss {first:.4f} -> {last:.4f} over {args.steps} steps; by quarter: {curve}")
    client.close()
    if not last < first:
        raise SystemExit("the loss did not fall")


if __name__ == "__main__":
    main()
