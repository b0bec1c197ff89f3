"""torch.compile of recstore.nn modules: one graph, and training exactly as in eager."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

from recstore import nn as rnn

from .conftest import unique_name

NUM, DIM, STEPS = 50, 4, 3


def _weights(seed: int = 3) -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(seed))


def _batch(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return {
        "grid": torch.randint(0, NUM, (6, 3), generator=g),
        "ids": torch.randint(0, NUM, (12,), generator=g),
        "ragged": torch.tensor([0, 2, 2, 7]),
        "weights": torch.rand(12, generator=g),
    }


class Model(torch.nn.Module):
    """Every lookup path: gather, padding + scaling, fixed bags (2-D, offsets), ragged
    bags (mean with padding, max, plain mean), weighted sums and a collection."""

    def __init__(self, client, seed: int = 0) -> None:
        super().__init__()

        def table(cls, **options):
            return cls(NUM, DIM, _weight=_weights(), client=client, name=unique_name("c"),
                       optimizer={"kind": "adagrad", "lr": 0.1}, **options)  # fmt: skip

        self.plain = table(rnn.Embedding)
        self.padded = table(rnn.Embedding, padding_idx=2, scale_grad_by_freq=True)
        self.normed = table(rnn.Embedding, max_norm=1.5)
        self.fixed = table(rnn.EmbeddingBag, mode="sum")
        self.ragged_mean = table(rnn.EmbeddingBag, mode="mean", padding_idx=4)
        self.ragged_max = table(rnn.EmbeddingBag, mode="max")
        self.ragged_sum = table(rnn.EmbeddingBag, mode="mean")
        self.weighted = table(rnn.EmbeddingBag, mode="sum")
        self.collection = rnn.EmbeddingBagCollection(
            [table(rnn.EmbeddingBag, mode="sum"), table(rnn.EmbeddingBag, mode="mean")]
        )
        torch.manual_seed(seed)
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, grid, ids, ragged, weights):
        offsets = torch.arange(0, 12, 3)
        parts = [
            self.plain(grid).sum(1),
            self.padded(grid).mean(1),
            self.normed(grid).sum(1),
            self.fixed(grid),
            self.fixed(ids, offsets),
            self.ragged_mean(ids, ragged),
            self.ragged_max(ids, ragged),
            self.ragged_sum(ids, ragged),
            self.weighted(ids, offsets, weights),
            *self.collection([grid, (ids, offsets)]),
        ]
        stacked = torch.stack([p[:4] for p in parts])
        return self.head(stacked).pow(2).mean()

    def tables(self) -> list:
        return [m for m in self.modules() if isinstance(m, rnn.EmbeddingBag | rnn.Embedding)]


def _train(model, step_fn, steps: int = STEPS) -> list[float]:
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = step_fn(**_batch(step))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("backend", ["local", "grpc"])
def test_compiled_training_matches_eager(backend, request) -> None:
    client = request.getfixturevalue(f"{backend}_client")
    eager, compiled = Model(client), Model(client)
    expected = _train(eager, eager)
    got = _train(compiled, torch.compile(compiled, backend="aot_eager", fullgraph=True))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    for a, b in zip(compiled.tables(), eager.tables(), strict=True):
        torch.testing.assert_close(a.weight, b.weight, atol=1e-5, rtol=0)
    torch.testing.assert_close(compiled.head.weight, eager.head.weight, atol=1e-5, rtol=0)
    assert not torch.equal(eager.plain.weight, _weights())  # the tables did train


def _graph_breaks(module, *args) -> int:
    torch._dynamo.reset()
    return torch._dynamo.explain(module)(*args).graph_break_count


def test_forward_has_no_graph_breaks(local_client) -> None:
    def make(cls, **options):
        return cls(NUM, DIM, client=local_client, name=unique_name("g"), **options)

    grid, ids = torch.randint(0, NUM, (4, 3)), torch.randint(0, NUM, (9,))
    ragged, fixed = torch.tensor([0, 4, 4]), torch.tensor([0, 3, 6])
    cases = [
        (make(rnn.Embedding), (grid,)),
        (make(rnn.Embedding, padding_idx=1, scale_grad_by_freq=True), (grid,)),
        (make(rnn.Embedding, max_norm=1.0), (grid,)),
        (make(rnn.EmbeddingBag, mode="sum"), (grid,)),
        (make(rnn.EmbeddingBag, mode="mean"), (ids, fixed)),
        (make(rnn.EmbeddingBag, mode="mean"), (ids, ragged)),
        (make(rnn.EmbeddingBag, mode="max", padding_idx=0), (ids, ragged)),
        (make(rnn.EmbeddingBag, mode="sum", include_last_offset=True), (ids, ragged)),
        (make(rnn.EmbeddingBag, mode="sum"), (ids, fixed, torch.rand(9))),
        (
            rnn.EmbeddingBagCollection([make(rnn.EmbeddingBag), make(rnn.EmbeddingBag)]),
            ([grid, (ids, ragged)],),
        ),
    ]
    for module, args in cases:
        assert _graph_breaks(module, *args) == 0, module


def test_inductor_training_matches_eager(local_client) -> None:
    """One compile through inductor (C++ codegen): same losses and rows as eager."""

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag = rnn.EmbeddingBag(NUM, DIM, mode="sum", _weight=_weights(),
                                        client=local_client, name=unique_name("i"))  # fmt: skip
            torch.manual_seed(0)
            self.head = torch.nn.Linear(DIM, 1)

        def forward(self, grid, ids, ragged, weights):
            return self.head(self.bag(grid)).pow(2).mean()

    eager, compiled = Small(), Small()
    expected = _train(eager, eager)
    got = _train(compiled, torch.compile(compiled, backend="inductor", fullgraph=True))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(compiled.bag.weight, eager.bag.weight, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["local", "grpc"])
def test_batches_of_every_size_share_one_dynamic_graph(backend, request) -> None:
    """After the first size change the batch size is symbolic on every path (padded bags
    included), so a compiled model does not recompile per batch size (torch's limit of
    eight recompiles would drop it back to eager)."""
    client = request.getfixturevalue(f"{backend}_client")

    class Padded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()

            def table(cls, **options):
                return cls(NUM, DIM, _weight=_weights(), client=client,
                           name=unique_name("d"), **options)  # fmt: skip

            self.ragged = table(rnn.EmbeddingBag, mode="mean", padding_idx=4)
            self.grid = table(rnn.EmbeddingBag, mode="max", padding_idx=4)
            self.weighted = table(rnn.EmbeddingBag, mode="sum")
            self.user = table(rnn.Embedding, padding_idx=4, scale_grad_by_freq=True)

        def forward(self, ids, offsets, weights, grid):
            parts = [
                self.ragged(ids, offsets),
                self.grid(grid),
                self.weighted(ids, offsets, weights),
                self.user(grid).sum(1),
            ]
            return torch.cat(parts, 1).pow(2).mean()

    def batch(size: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(size)
        lengths = torch.arange(size) % 3  # a new id count and bag count each time
        ids = torch.randint(0, NUM, (int(lengths.sum()),), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        return (
            ids,
            offsets,
            torch.rand(ids.shape, generator=g),
            torch.randint(0, NUM, (size, 3), generator=g),
        )

    eager, compiled = Padded(), Padded()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    run = torch.compile(compiled, backend=counter)
    for size in range(4, 16):
        expected, got = eager(*batch(size)), run(*batch(size))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0, msg=f"size {size}")
        expected.backward()
        got.backward()
    assert counter.frame_count == 2  # the first batch's static graph, then one dynamic one
    for a, b in ((compiled.ragged, eager.ragged), (compiled.grid, eager.grid),
                 (compiled.weighted, eager.weighted), (compiled.user, eager.user)):  # fmt: skip
        torch.testing.assert_close(a.weight, b.weight, atol=1e-5, rtol=0)
