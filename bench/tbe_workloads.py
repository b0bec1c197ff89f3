"""Multi-hot embedding steps against FBGEMM's CPU TBE (``train_bench.py --tbe``).

The engine TorchRec trains with, FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``
on the host (``EmbeddingLocation.HOST``, ``ComputeDevice.CPU``) with its fused
optimizer, is the peer: several tables of bags pooled by sum, a loss whose
gradient per pooled row is fixed, backward applying the optimizer. The same
step runs with ``torch.nn.EmbeddingBag(sparse=True)`` + torch.optim, with a
``recstore.nn.EmbeddingBagCollection`` on the local backend (eager, and under
``torch.compile``) and over gRPC. FBGEMM is optional (``pip install --no-deps
fbgemm-gpu-cpu==1.8.0``, the build that loads with this torch); without it the
peer is skipped with a message. ``check_numerics`` trains RecStore local and
FBGEMM from the same rows on the same batches and compares the tables.

``CRITEO`` is the embedding side of the Criteo Kaggle DLRM: its 26 sparse
features' cardinalities (3 to 10.1M, 33.8M rows; the big ones scaled by
``--criteo-scale`` to fit memory), dim 16, one id per feature, skewed ids,
row-wise Adagrad. ``python_time`` profiles a step's interpreter time (what
grows with the number of tables when a step plans them one by one).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from recstore import nn as rnn
from recstore.client import RecStoreClient

INIT_RANGE = 0.05
EPS = 1e-8


@dataclass(frozen=True)
class Workload:
    name: str
    optimizer: str  # "sgd" or "rowwise_adagrad"
    zipf: float | None  # None: uniform ids
    bag_size: int
    lr: float
    #: each table's rows and the dim (empty, 0: --tbe-tables x --tbe-rows, --tbe-dim)
    rows: tuple[int, ...] = ()
    dim: int = 0


#: the Criteo Kaggle DLRM's 26 sparse features (33.8M rows)
CRITEO_KAGGLE_ROWS = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
CRITEO = Workload(
    "criteo-kaggle-rowwise-adagrad", "rowwise_adagrad", 1.05, 1, 0.05, CRITEO_KAGGLE_ROWS, 16
)

WORKLOADS = (
    Workload("uniform-sgd", "sgd", None, 10, 0.05),
    Workload("zipf-rowwise-adagrad", "rowwise_adagrad", 1.05, 10, 0.05),
    Workload("single-id-sgd", "sgd", None, 1, 0.05),
    CRITEO,
)

Batch = tuple[list[torch.Tensor], torch.Tensor]  # per table [B, L] ids; the pooled gradient


def scaled(rows: Sequence[int], scale: float) -> list[int]:
    """Cardinalities above 1M times ``scale`` (what fits this host's memory)."""
    return [max(1_000_000, round(r * scale)) if r > 1_000_000 else r for r in rows]


def split_tables(rows: Sequence[int], parts: int) -> list[int]:
    """Every table as ``parts`` tables of its rows / parts (same total rows, more tables)."""
    return [max(1, r // parts) for r in rows for _ in range(parts)]


def batches(work: Workload, rows: Sequence[int], batch: int, dim: int, count: int) -> list[Batch]:
    """``count`` batches: ids per table ([batch, bag_size]) and a fixed output gradient."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        ids = []
        for size in rows:
            if work.zipf is None:
                drawn = rng.integers(0, size, (batch, work.bag_size))
            else:  # heavy head over a scattering of the rows (a bijection: odd * rank + shift)
                ranks = (rng.zipf(work.zipf, (batch, work.bag_size)) - 1) % size
                drawn = _scatter(ranks, size, int(rng.integers(0, size)))
            ids.append(torch.from_numpy(drawn.astype(np.int64)))
        target = torch.from_numpy(rng.normal(0, 1, (batch, len(rows) * dim)).astype(np.float32))
        out.append((ids, target))
    return out


def _scatter(ranks: np.ndarray, size: int, shift: int) -> np.ndarray:
    multiplier = 2_654_435_761  # prime: coprime with every size below it
    return (ranks.astype(np.int64) * (multiplier % size or 1) + shift) % size


def loss_of(pooled: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient with respect to the pooled rows is ``target`` / batch."""
    return (pooled * target).sum() / target.shape[0]


class TorchBags(nn.Module):
    def __init__(self, rows: Sequence[int], dim: int) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(r, dim, mode="sum", sparse=True) for r in rows)
        for bag in self.bags:
            nn.init.uniform_(bag.weight, -INIT_RANGE, INIT_RANGE)

    def forward(self, ids: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([bag(x) for bag, x in zip(self.bags, ids, strict=True)], dim=1)


class RecStoreBags(nn.Module):
    def __init__(self, client: RecStoreClient, work: Workload, rows: Sequence[int], dim: int,
                 join: str = "concat"):  # fmt: skip
        super().__init__()
        self.join = join  # "cat": the outputs one by one, then torch.cat (the baseline)
        prefix = f"tbe_{uuid.uuid4().hex[:8]}"
        optimizer = {"kind": work.optimizer, "lr": work.lr, "eps": EPS}
        self.bags = [
            rnn.EmbeddingBag(
                size,
                dim,
                mode="sum",
                name=f"{prefix}_{i}",
                client=client,
                optimizer=optimizer,
                seed=i,
                initializer={"kind": "uniform", "low": -INIT_RANGE, "high": INIT_RANGE},
            )
            for i, size in enumerate(rows)
        ]
        self.collection = rnn.EmbeddingBagCollection(self.bags)

    def forward(self, ids: list[torch.Tensor]) -> torch.Tensor:
        if self.join == "cat":
            return torch.cat(self.collection(ids), dim=1)
        return self.collection.concat(ids)  # each table pooled straight into its columns


def fbgemm_available() -> str | None:
    """None when FBGEMM's CPU TBE loads, else why not (one line)."""
    try:
        import fbgemm_gpu  # noqa: F401
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as error:  # an absent or broken install: the peer is skipped
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


class FbgemmBags(nn.Module):
    """FBGEMM's CPU TBE over all tables, fused SGD or row-wise Adagrad."""

    def __init__(self, work: Workload, rows: Sequence[int], dim: int) -> None:
        super().__init__()
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        kind = {
            "sgd": EmbOptimType.EXACT_SGD,
            "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        }
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(r, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for r in rows],
            optimizer=kind[work.optimizer], learning_rate=work.lr, eps=EPS,
            pooling_mode=PoolingMode.SUM,
        )  # fmt: skip
        for weight in self.tbe.split_embedding_weights():
            weight.uniform_(-INIT_RANGE, INIT_RANGE)
        self.bag_size = work.bag_size
        self._offsets: dict[int, torch.Tensor] = {}

    def forward(self, ids: list[torch.Tensor]) -> torch.Tensor:
        indices = torch.cat([x.reshape(-1) for x in ids])
        bags = len(ids) * ids[0].shape[0]
        offsets = self._offsets.get(bags)
        if offsets is None:
            offsets = self._offsets[bags] = torch.arange(0, bags + 1) * self.bag_size
        out: torch.Tensor = self.tbe(indices, offsets)
        return out


def torch_optimizer(model: TorchBags, work: Workload) -> torch.optim.Optimizer:
    """SGD, or Adagrad for row-wise Adagrad (torch has no row-wise variant: timing only)."""
    if work.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=work.lr)
    return torch.optim.Adagrad(model.parameters(), lr=work.lr, eps=EPS)


def step(model: nn.Module, optimizer: torch.optim.Optimizer | None, batch: Batch) -> None:
    ids, target = batch
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    loss_of(model(ids), target).backward()  # RecStore and FBGEMM update the tables here
    if optimizer is not None:
        optimizer.step()


def check_numerics(
    work: Workload,
    rows: Sequence[int],
    dim: int,
    data: list[Batch],
    make_client: Callable[[], Any],
) -> float:
    """Largest |difference| of the touched rows after training RecStore local and FBGEMM
    from the same rows on ``data`` (SGD: float rounding; row-wise Adagrad: within 1e-4)."""
    client = make_client()
    ours = RecStoreBags(client, work, rows, dim)
    peer = FbgemmBags(work, rows, dim)
    for bag, weight in zip(ours.bags, peer.tbe.split_embedding_weights(), strict=True):
        weight.copy_(bag.read_weights())
    for batch in data:
        step(ours, None, batch)
        step(peer, None, batch)
    worst = 0.0
    for i, (bag, weight) in enumerate(
        zip(ours.bags, peer.tbe.split_embedding_weights(), strict=True)
    ):
        touched = torch.unique(torch.cat([b[0][i].reshape(-1) for b in data]))
        diff = (bag.read_weights(touched) - weight[touched]).abs().max()
        worst = max(worst, float(diff))
        client.delete_data(bag.table_name)
    client.close()
    return worst


def python_time(model: nn.Module, data: list[Batch], steps: int) -> tuple[float, float]:
    """Seconds per step spent running RecStore's Python code, and its function calls per
    step: the own time and calls of the ``recstore`` package's functions but the one
    that calls the engine's group methods (cProfile counts a nanobind method's time as
    its caller's own time: that caller's own time is the engine's). The model's loss and
    torch's autograd are not counted."""
    # CPU time of this thread: on a shared machine, time preempted is the neighbours'
    profiler = cProfile.Profile(time.thread_time)
    for index in range(steps):
        batch = data[index % len(data)]
        profiler.enable()
        step(model, None, batch)
        profiler.disable()
    stats = pstats.Stats(profiler)
    own = calls = 0.0
    for (filename, _, function), entry in stats.stats.items():  # type: ignore[attr-defined]
        if filename.endswith(".py") and f"{os.sep}recstore{os.sep}" in filename:
            calls += entry[1]
            if function != ENGINE_CALLER:
                own += entry[2]  # tottime
    return own / steps, calls / steps


#: the function of the local backend that makes the engine's group calls
ENGINE_CALLER = "_group_call"
