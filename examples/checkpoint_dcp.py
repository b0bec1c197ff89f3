"""Checkpoints of a model with a RecStore table: torch.save and torch.distributed.checkpoint.

A recstore.nn.EmbeddingBag carries its table as ``weight`` in ``state_dict()``,
so ``torch.save`` / ``load_state_dict`` work as for torch.nn; for a table too
big for the trainer's memory, ``recstore.client.checkpoint.save`` / ``load``
write and read it through torch.distributed.checkpoint in row blocks. Either
checkpoint also loads into the same model built with torch.nn. Inside
``recstore.nn.optimizer_state(model)`` the state dict also carries the
table's optimizer state (here Adagrad's ``optimizer.sum``), so a restored
model trains on exactly as the original would.

Run: python examples/checkpoint_dcp.py   (local backend; no PS node needed)
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from recstore import RecStoreClient
from recstore import nn as rnn
from recstore.client import checkpoint

NUM, DIM = 10_000, 16


class Model(torch.nn.Module):
    def __init__(self, bag: torch.nn.Module) -> None:
        super().__init__()
        self.bag, self.head = bag, torch.nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids, offsets))


def main() -> None:
    warnings.filterwarnings("ignore", message=".*in a single process")  # DCP without a group
    client = RecStoreClient()
    model = Model(rnn.EmbeddingBag(NUM, DIM, mode="sum", client=client, name="ckpt_items"))
    ids, offsets = torch.tensor([1, 5, 7, 5, 9999], dtype=torch.int32), torch.tensor([0, 2])
    model(ids, offsets).sum().backward()  # the table updates itself

    with tempfile.TemporaryDirectory() as tmp:
        # 1. torch.save / torch.load: weight is an ordinary tensor in the state dict
        torch.save(model.state_dict(), Path(tmp) / "model.pt")
        as_torch = Model(torch.nn.EmbeddingBag(NUM, DIM, mode="sum"))
        as_torch.load_state_dict(torch.load(Path(tmp) / "model.pt"))

        # 2. DCP in row blocks: the table is never one tensor in this process
        checkpoint.save(model, Path(tmp) / "dcp")
        restored = Model(rnn.EmbeddingBag(NUM, DIM, mode="sum", client=client, name="ckpt_copy"))
        checkpoint.load(restored, Path(tmp) / "dcp")

        # 3. the DCP checkpoint is plain DCP to torch.nn
        plain = Model(torch.nn.EmbeddingBag(NUM, DIM, mode="sum"))
        state = plain.state_dict()
        dcp.load(state, checkpoint_id=Path(tmp) / "dcp")
        plain.load_state_dict(state)

    expected = model(ids, offsets)
    for other in (as_torch, restored, plain):
        torch.testing.assert_close(other(ids, offsets), expected, atol=0, rtol=0)
    print("torch.save, recstore DCP and torch.nn loads agree:", expected.detach().view(-1).tolist())
    resume_with_optimizer_state(client, ids, offsets)
    for name in client.data_name_list():
        client.delete_data(name)


def resume_with_optimizer_state(
    client: RecStoreClient, ids: torch.Tensor, offsets: torch.Tensor
) -> None:
    """4. Optimizer state in the checkpoint: training resumes exactly."""
    adagrad = {"kind": "adagrad", "lr": 0.1}

    def build(name: str) -> Model:
        torch.manual_seed(0)  # the same dense head in both models
        return Model(rnn.EmbeddingBag(NUM, DIM, mode="sum", client=client, name=name,
                                      optimizer=adagrad))  # fmt: skip

    def step(model: Model) -> None:
        model(ids, offsets).sum().backward()  # the table's Adagrad step (the head stays)

    trained, resumed = build("ckpt_adagrad"), build("ckpt_adagrad_resumed")
    step(trained)
    with tempfile.TemporaryDirectory() as tmp:
        with rnn.optimizer_state(trained):
            state = trained.state_dict()  # bag.weight, bag.optimizer.sum, head.*
            torch.save(state, Path(tmp) / "train.pt")
        with rnn.optimizer_state(resumed):
            resumed.load_state_dict(torch.load(Path(tmp) / "train.pt"))
    step(trained)
    step(resumed)
    torch.testing.assert_close(resumed.bag.read_weights(), trained.bag.read_weights(),
                               atol=0, rtol=0)  # fmt: skip
    print("optimizer state restored:", sorted(k for k in state if k.startswith("bag.")))


if __name__ == "__main__":
    main()
