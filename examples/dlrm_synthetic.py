"""A DLRM-style click-through model trained against RecStore on synthetic data.

Several sparse features (each a bag of ids looked up in its own embedding
table) and a few dense features feed a small MLP that predicts a click. The
clicks come from a hidden ground-truth model, so the loss visibly falls.
The embedding tables are ``recstore.nn.EmbeddingBag`` modules whose optimizer
runs in RecStore; the MLP is trained by a plain torch optimizer. With
``--collection`` the bags are looked up as one ``recstore.nn.EmbeddingBagCollection``:
over gRPC, one MultiPull and one MultiUpdate per PS node and step instead of
one Pull and one Update per table and node.

    python examples/dlrm_synthetic.py --steps 300                    # local backend
    python examples/dlrm_synthetic.py --backend grpc --endpoints h1:50051,h2:50051
    python examples/dlrm_synthetic.py --backend grpc --endpoints h1:50051,h2:50051 --collection
    python examples/dlrm_synthetic.py --backend grpc --admin-url http://admin:8080

Importable: ``bench/train_bench.py`` and ``make demo`` reuse ``SyntheticClicks``,
``DLRM`` and ``train``.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from recstore.client import EmbeddingBagCollection, RecStoreClient
from recstore.client import nn as rnn


@dataclass(frozen=True)
class DataConfig:
    num_features: int = 8  # sparse features, one embedding table each
    cardinality: int = 100_000  # ids per feature
    bag_size: int = 4  # ids per sample and feature (multi-hot)
    num_dense: int = 13
    batch_size: int = 512
    seed: int = 0


class SyntheticClicks:
    """Batches of (dense, sparse ids, offsets, labels) from a hidden logistic model."""

    def __init__(self, config: DataConfig) -> None:
        self.config = config
        g = torch.Generator().manual_seed(config.seed)
        # Hidden truth: a score per id of each feature plus a dense weight vector.
        self._id_scores = [
            torch.randn(config.cardinality, generator=g) for _ in range(config.num_features)
        ]
        self._dense_weights = torch.randn(config.num_dense, generator=g) / config.num_dense**0.5
        # Zipf-like id popularity, as in real click logs.
        ranks = torch.arange(1, config.cardinality + 1, dtype=torch.float64)
        self._popularity = (1.0 / ranks**1.05).float()

    def batch(
        self, step: int
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, torch.Tensor]:
        c = self.config
        g = torch.Generator().manual_seed(c.seed * 1_000_003 + step)
        dense = torch.randn(c.batch_size, c.num_dense, generator=g)
        n = c.batch_size * c.bag_size
        sparse = [
            torch.multinomial(self._popularity, n, replacement=True, generator=g)
            for _ in range(c.num_features)
        ]
        offsets = torch.arange(0, n, c.bag_size)
        logit = dense @ self._dense_weights
        for ids, scores in zip(sparse, self._id_scores, strict=True):
            logit = logit + scores[ids].view(c.batch_size, c.bag_size).mean(1)
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        return dense, sparse, offsets, labels


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


#: Small initial embeddings keep the dot interactions of a fresh model near zero.
INIT_RANGE = 0.05

EmbeddingFactory = Callable[[int, int, int], nn.Module]  # (feature index, rows, dim) -> bag


def recstore_bags(client: RecStoreClient, lr: float, prefix: str | None = None) -> EmbeddingFactory:
    prefix = prefix or f"dlrm_{uuid.uuid4().hex[:8]}"

    def make(index: int, rows: int, dim: int) -> nn.Module:
        return rnn.EmbeddingBag(
            rows, dim, mode="sum", name=f"{prefix}_f{index}", client=client,
            optimizer={"kind": "sgd", "lr": lr}, seed=index,
            initializer={"kind": "uniform", "low": -INIT_RANGE, "high": INIT_RANGE},
        )  # fmt: skip

    return make


def torch_bags(index: int, rows: int, dim: int) -> nn.Module:
    bag = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
    nn.init.uniform_(bag.weight, -INIT_RANGE, INIT_RANGE)
    return bag


class DLRM(nn.Module):
    """Bottom MLP on dense features, one bag per sparse feature, dot interactions, top MLP.

    ``collection=True`` (RecStore bags only) looks every bag up at once through an
    ``EmbeddingBagCollection``; the bags stay in ``self.bags`` either way.
    """

    def __init__(
        self,
        data: DataConfig,
        embedding_dim: int,
        make_bag: EmbeddingFactory,
        collection: bool = False,
    ) -> None:
        super().__init__()
        self.bags = nn.ModuleList(
            make_bag(i, data.cardinality, embedding_dim) for i in range(data.num_features)
        )
        self.collection = EmbeddingBagCollection(list(self.bags)) if collection else None
        self.bottom = mlp([data.num_dense, 64, embedding_dim])
        pairs = (data.num_features + 1) * data.num_features // 2
        self.top = mlp([embedding_dim + pairs, 64, 1])

    def forward(
        self, dense: torch.Tensor, sparse: list[torch.Tensor], offsets: torch.Tensor
    ) -> torch.Tensor:
        x = self.bottom(dense)
        if self.collection is not None:
            pooled = self.collection([(ids, offsets) for ids in sparse])
        else:
            pooled = [bag(ids, offsets) for bag, ids in zip(self.bags, sparse, strict=True)]
        vectors = [x, *pooled]
        stacked = torch.stack(vectors, dim=1)  # [B, F+1, D]
        dots = stacked @ stacked.transpose(1, 2)
        rows, cols = torch.triu_indices(len(vectors), len(vectors), offset=1)
        return self.top(torch.cat([x, dots[:, rows, cols]], dim=1)).squeeze(1)

    def prefetch(self, sparse: list[torch.Tensor], offsets: torch.Tensor) -> None:
        """Start fetching the next batch's rows (a collection over gRPC: with this step's grads)."""
        if self.collection is not None:
            self.collection.prefetch([(ids, offsets) for ids in sparse])


def dense_optimizer(model: DLRM, lr: float) -> list[torch.optim.Optimizer]:
    """SGD for the MLPs; torch bags (sparse grads) get their own SGD, RecStore bags none."""
    optimizers: list[torch.optim.Optimizer] = [
        torch.optim.SGD([*model.bottom.parameters(), *model.top.parameters()], lr=lr)
    ]
    bag_params = list(model.bags.parameters())
    if bag_params:
        optimizers.append(torch.optim.SGD(bag_params, lr=lr))
    return optimizers


def train_step(
    model: DLRM,
    optimizers: list[torch.optim.Optimizer],
    batch: tuple,
    next_batch: tuple | None = None,
) -> float:
    """One step; given ``next_batch``, its rows are fetched while this step finishes."""
    dense, sparse, offsets, labels = batch
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.binary_cross_entropy_with_logits(model(dense, sparse, offsets), labels)
    if next_batch is not None:
        model.prefetch(next_batch[1], next_batch[2])
    loss.backward()  # RecStore bags apply their update here
    for optimizer in optimizers:
        optimizer.step()
    return float(loss.detach())


def train(
    model: DLRM, data: SyntheticClicks, steps: int, lr: float, progress: bool = True
) -> list[float]:
    optimizers = dense_optimizer(model, lr)
    losses: list[float] = []
    bar = tqdm(range(steps), desc="train", disable=not progress, unit="step")
    batch = data.batch(0)
    for step in bar:
        next_batch = data.batch(step + 1) if step + 1 < steps else None
        losses.append(train_step(model, optimizers, batch, next_batch))
        batch = next_batch
        if step % 10 == 0 or step == steps - 1:
            recent = losses[-20:]
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.4f}")
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--num-features", type=int, default=8)
    parser.add_argument("--cardinality", type=int, default=100_000)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--backend", choices=["local", "grpc"], default="local")
    parser.add_argument("--endpoints", help="PS nodes host:port,... in shard order (grpc)")
    parser.add_argument("--admin-url", help="admin API for table discovery (grpc)")
    parser.add_argument(
        "--collection",
        action="store_true",
        help="look the bags up as one EmbeddingBagCollection (one request per PS node)",
    )
    parser.add_argument(
        "--transport-dtype",
        choices=["float16", "bfloat16"],
        help="grpc: rows and gradients travel in this dtype (the nodes keep float32)",
    )
    args = parser.parse_args(argv)

    client = RecStoreClient()
    if args.backend == "grpc":
        if args.endpoints:
            client.set_ps_endpoints(args.endpoints)
        elif args.admin_url:
            client.set_admin_url(args.admin_url)
        else:
            parser.error("--backend grpc needs --endpoints or --admin-url")
        if args.transport_dtype:
            client.set_transport_dtype(args.transport_dtype)
    else:
        client.set_ps_backend("local")
    torch.manual_seed(0)
    data_config = DataConfig(args.num_features, args.cardinality, batch_size=args.batch_size)
    model = DLRM(
        data_config, args.embedding_dim, recstore_bags(client, args.lr), collection=args.collection
    )
    losses = train(model, SyntheticClicks(data_config), args.steps, args.lr)
    window = max(1, min(20, len(losses) // 4))
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    how = "one collection" if args.collection else "one module per bag"
    print(
        f"loss {first:.4f} -> {last:.4f} over {args.steps} steps ({client.backend} backend, {how})"
    )
    for bag in model.bags:
        client.delete_data(str(bag.table_name))


if __name__ == "__main__":
    main()
