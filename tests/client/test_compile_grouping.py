"""torch.compile of separate bags: their pool calls merge into one, training unchanged."""

from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo.backends.debugging import aot_eager
from torch.profiler import ProfilerActivity, profile

from recstore import nn as rnn
from recstore.client import pool_grouping

from .conftest import unique_name

NUM, DIM, BAGS, SIZE = 30, 4, 4, 3


def _initial(seed: int) -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(seed))


class Separate(torch.nn.Module):
    """One module per feature (as DLRM): a frozen bag, 2-D and 1-D-with-offsets bags,
    and a bag whose ids depend on another's rows (that call cannot join the others)."""

    def __init__(self, client) -> None:
        super().__init__()

        def bag(mode: str, seed: int, **options) -> rnn.EmbeddingBag:
            return rnn.EmbeddingBag(NUM, DIM, mode=mode, _weight=_initial(seed), client=client,
                                    name=unique_name("g"), optimizer="adagrad",
                                    **options)  # fmt: skip

        self.frozen = bag("sum", 1, _freeze=True)
        self.grid = bag("sum", 2)
        self.offsets = bag("mean", 3)
        self.later = bag("sum", 4)
        torch.manual_seed(0)
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, grid, ids, offsets):
        first = [self.frozen(grid), self.grid(grid), self.offsets(ids, offsets)]
        shifted = (grid + (first[1].sum() > 1e9).long()) % NUM  # reads a pooled row
        parts = [*first, self.later(shifted)]
        return self.head(torch.cat(parts)).pow(2).mean()

    def tables(self) -> list[torch.Tensor]:
        return [m.weight for m in self.modules() if isinstance(m, rnn.EmbeddingBag)]


def _batch(step: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(70 + step)
    grid = torch.randint(0, NUM, (BAGS, SIZE), generator=g)
    ids = torch.randint(0, NUM, (BAGS * SIZE,), generator=g)
    return grid, ids, torch.arange(0, BAGS * SIZE, SIZE)


def _train(model, step_fn, steps: int = 3) -> list[float]:
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = step_fn(*_batch(step))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _pool_calls(graph: torch.fx.Graph) -> int:
    return sum(1 for node in graph.nodes if node.target in pool_grouping._pool_targets())


def test_grouped_pool_calls_train_as_eager(local_client) -> None:
    """The pass on the captured graph: the three independent calls become one, the
    dependent one stays apart; losses and tables as eager's (the frozen bag unchanged)."""
    counts: list[tuple[int, int]] = []

    def grouping_backend(gm: torch.fx.GraphModule, example_inputs):
        before = _pool_calls(gm.graph)
        pool_grouping.group_pool_calls(gm.graph)
        gm.graph.lint()
        gm.recompile()
        counts.append((before, _pool_calls(gm.graph)))
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    eager, compiled = Separate(local_client), Separate(local_client)
    expected = _train(eager, eager)
    got = _train(compiled, torch.compile(compiled, backend=grouping_backend, fullgraph=True))
    assert counts and set(counts) == {(4, 2)}  # each graph compiled
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    for a, b in zip(compiled.tables(), eager.tables(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(compiled.frozen.weight, _initial(1))
    assert not torch.equal(compiled.grid.weight, _initial(2))  # the tables did train


def test_no_grad_between_pool_calls_keeps_them_apart(local_client) -> None:
    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = rnn.EmbeddingBag(NUM, DIM, mode="sum", client=local_client,
                                      name=unique_name("n"))  # fmt: skip
            self.b = rnn.EmbeddingBag(NUM, DIM, mode="sum", client=local_client,
                                      name=unique_name("n"))  # fmt: skip

        def forward(self, grid):
            first = self.a(grid)
            with torch.no_grad():
                second = self.b(grid)
            return first + second

    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(Mixed(), backend=capture, fullgraph=True)(_batch(0)[0])
    (gm,) = graphs
    pool_grouping.group_pool_calls(gm.graph)
    assert _pool_calls(gm.graph) == 2


def test_inductor_runs_one_pool_and_one_update_call_per_step(local_client) -> None:
    """torch.compile as documented (inductor): the pass is registered on tracing."""
    torch._dynamo.reset()
    model = Separate(local_client)
    compiled = torch.compile(model)
    _train(model, compiled, steps=1)  # compiles
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled(*_batch(1)).backward()
    calls = {e.key: e.count for e in prof.key_averages() if e.key.startswith("recstore::")}
    assert calls == {"recstore::emb_pool_many": 2, "recstore::emb_update_pooled_many": 2}
