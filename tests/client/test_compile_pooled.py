"""torch.compile of plain sum/mean bags: the engine pools them, exactly as eagerly."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch.profiler import ProfilerActivity, profile

from recstore import nn as rnn
from recstore.client.module_tables import ModuleTables

from .conftest import unique_name

NUM, DIM, BAGS, SIZE = 40, 4, 4, 3


def _initial() -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(7))


class Bags(torch.nn.Module):
    """Plain bags every way a model hands them in: 2-D, 1-D with offsets, a collection."""

    def __init__(self, client, optimizer) -> None:
        super().__init__()

        def bag(mode: str) -> rnn.EmbeddingBag:
            return rnn.EmbeddingBag(NUM, DIM, mode=mode, _weight=_initial(), client=client,
                                    name=unique_name("p"), optimizer=optimizer)  # fmt: skip

        self.grid_sum, self.offsets_mean = bag("sum"), bag("mean")
        self.collection = rnn.EmbeddingBagCollection([bag("sum"), bag("mean")])
        torch.manual_seed(0)
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, grid: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor):
        parts = [
            self.grid_sum(grid),
            self.offsets_mean(ids, offsets),
            *self.collection([grid, (ids, offsets)]),
        ]
        return self.head(torch.cat(parts)).pow(2).mean()

    def tables(self) -> list[torch.Tensor]:
        return [m.weight for m in self.modules() if isinstance(m, rnn.EmbeddingBag)]


def _batch(step: int, ragged: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(50 + step)
    grid = torch.randint(0, NUM, (BAGS, SIZE), generator=g)
    ids = torch.randint(0, NUM, (BAGS * SIZE,), generator=g)
    # same shapes either way: one compiled graph sees uniform and ragged offsets
    offsets = torch.tensor([0, 1, 5, 5]) if ragged else torch.arange(0, BAGS * SIZE, SIZE)
    return grid, ids, offsets


def _train(model, step_fn, batches) -> list[float]:
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)
    losses = []
    for batch in batches:
        optimizer.zero_grad()
        loss = step_fn(*batch)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.fixture
def engine_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the engine pooled bags and took their per-bag gradients."""
    calls = {"pool_bags": 0, "update_bags": 0}
    for name in calls:
        original = getattr(ModuleTables, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(ModuleTables, name, counted)
    return calls


def test_compiled_plain_bags_pool_in_the_engine(local_client, engine_calls) -> None:
    torch._dynamo.reset()
    model = Bags(local_client, "adagrad")
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    _train(model, compiled, [_batch(0)])  # compiles
    for name in engine_calls:
        engine_calls[name] = 0

    def step() -> None:
        compiled(*_batch(1)).backward()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ran = {e.key for e in prof.key_averages() if e.key.startswith("recstore::")}
    assert ran == {"recstore::emb_pool_many", "recstore::emb_update_pooled_many"}
    assert engine_calls == {"pool_bags": 4, "update_bags": 4}  # every bag, offsets ones too


@pytest.mark.parametrize(("backend", "ragged"), [("local", False), ("local", True), ("grpc", True)])
def test_compiled_pooled_training_is_eager_training(backend, ragged, request) -> None:
    """Losses and rows as eager's after K steps: bit for bit where the engine pools in
    both; within 1e-5 with ragged offsets in some steps (per-id rows, segment sums,
    where eager takes torch's embedding_bag) and over gRPC."""
    client = request.getfixturevalue(f"{backend}_client")
    torch._dynamo.reset()
    optimizer = {"kind": "rowwise_adagrad", "lr": 0.1}
    batches = [_batch(step, ragged and step % 2 == 1) for step in range(5)]
    eager, compiled = Bags(client, optimizer), Bags(client, optimizer)
    expected = _train(eager, eager, batches)
    got = _train(compiled, torch.compile(compiled, backend="aot_eager", fullgraph=True), batches)
    atol = 1e-5 if ragged else 0.0
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)
    for a, b in zip(compiled.tables(), eager.tables(), strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)
    assert not torch.equal(eager.grid_sum.weight, _initial())  # the tables did train


def test_traced_pooled_bags_have_no_graph_breaks(local_client) -> None:
    model = Bags(local_client, "adagrad")
    torch._dynamo.reset()
    assert torch._dynamo.explain(model)(*_batch(0)).graph_break_count == 0


def test_pool_op_shapes_under_fake_tensors(local_client) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    bag = rnn.EmbeddingBag(NUM, DIM, mode="mean", client=local_client, name=unique_name("f"))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        grid, ids, offsets = (mode.from_tensor(t) for t in _batch(0))
        out = torch.ops.recstore.emb_pool_many(
            bag._anchor, [bag._handle] * 2, [grid.reshape(-1), ids], [None, offsets],
            [SIZE, -1], [True, True], [True, True],
        )  # fmt: skip
    assert [tuple(o.shape) for o in out] == [(BAGS, DIM), (BAGS, DIM)]
