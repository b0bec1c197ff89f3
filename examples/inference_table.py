"""Serving a trained table read-only: ``optimize_for_training=False``.

A model is trained for a few steps with an Adagrad table; its state dict is
then loaded into the same model built with an inference table, which keeps no
optimizer state (about half the memory per row here), answers exactly as the
trained model does, and refuses updates.

Run: python examples/inference_table.py   (local backend; no PS node needed)
"""

from __future__ import annotations

import torch

from recstore import RecStoreClient
from recstore import nn as rnn
from recstore.client import BackendError

NUM, DIM = 5_000, 32
ADAGRAD = {"kind": "adagrad", "lr": 0.05}


class Model(torch.nn.Module):
    def __init__(self, bag: torch.nn.Module) -> None:
        super().__init__()
        self.bag, self.head = bag, torch.nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids, offsets))


def batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, NUM, (256 * 4,), generator=generator, dtype=torch.int32)
    return ids, torch.arange(0, ids.numel(), 4)


def main() -> None:
    client = RecStoreClient()
    generator = torch.Generator().manual_seed(0)
    trained = Model(
        rnn.EmbeddingBag(NUM, DIM, mode="sum", optimizer=ADAGRAD, client=client, name="items")
    )
    head = torch.optim.SGD(trained.head.parameters(), lr=0.05)
    for _ in range(20):
        ids, offsets = batch(generator)
        loss = trained(ids, offsets).pow(2).mean()
        head.zero_grad()
        loss.backward()
        head.step()

    served = Model(
        rnn.EmbeddingBag(
            NUM, DIM, mode="sum", optimizer=ADAGRAD, optimize_for_training=False,
            client=client, name="items_served",
        )
    )  # fmt: skip
    served.load_state_dict(trained.state_dict())
    ids, offsets = batch(generator)
    with torch.no_grad():
        torch.testing.assert_close(served(ids, offsets), trained(ids, offsets))
    print("outputs agree")

    try:
        client.update("items_served", torch.tensor([1]), torch.ones(1, DIM))
    except BackendError as refused:
        print(f"updates refused: {refused}")
    else:
        raise SystemExit("an inference table accepted an update")


if __name__ == "__main__":
    main()
