"""``EmbeddingBagCollection.concat``: the bags' outputs side by side with no concatenating copy.

It must give ``torch.cat(collection(features), dim=1)`` and train the tables
exactly as that does, eagerly and under ``torch.compile`` (one
``emb_pool_cat`` call and one ``emb_update_pooled_cat`` a step, no graph
break), with each table's gradient handed to the engine as its column slice of
the one gradient (no copy); bad input changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
from torch.profiler import ProfilerActivity, profile

from recstore import nn as rnn
from recstore.client.module_tables import ModuleTables

from .conftest import unique_name

NUM, BAGS, SIZE = 40, 4, 3
DIMS = (4, 3, 5)


def _initial(dim: int) -> torch.Tensor:
    return torch.randn(NUM, dim, generator=torch.Generator().manual_seed(dim))


class Concat(torch.nn.Module):
    """A collection of sum/mean bags of several widths, 2-D and offsets inputs, one head."""

    def __init__(self, client: Any, optimizer: Any, *, joined: bool, grouped: bool = True) -> None:
        super().__init__()
        modes = ("sum", "mean", "sum")
        bags = [
            rnn.EmbeddingBag(
                NUM,
                dim,
                mode=mode,
                _weight=_initial(dim),
                client=client,
                name=unique_name("c"),
                optimizer=optimizer,
            )
            for dim, mode in zip(DIMS, modes, strict=True)
        ]
        self.collection = rnn.EmbeddingBagCollection(bags, grouped=grouped)
        self.joined = joined
        torch.manual_seed(0)
        self.head = torch.nn.Linear(sum(DIMS), 1)

    def pooled(self, grid: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor):
        features = [grid, (ids, offsets), grid]
        if self.joined:
            return self.collection.concat(features)
        return torch.cat(self.collection(features), dim=1)

    def forward(self, grid: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor):
        return self.head(self.pooled(grid, ids, offsets)).pow(2).mean()

    def tables(self) -> list[torch.Tensor]:
        return [bag.weight for bag in self.collection.bags]


def _batch(step: int, ragged: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(80 + step)
    grid = torch.randint(0, NUM, (BAGS, SIZE), generator=g)
    ids = torch.randint(0, NUM, (BAGS * SIZE,), generator=g)
    offsets = torch.tensor([0, 2, 2, 7]) if ragged else torch.arange(0, BAGS * SIZE, SIZE)
    return grid, ids, offsets


def _train(model: Concat, step_fn: Any, batches: list[tuple[torch.Tensor, ...]]) -> list[float]:
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
def bag_grads(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The gradient rows each engine bag update received (to see whether they were copied)."""
    seen: list[torch.Tensor] = []
    original = ModuleTables.update_bags

    def watched(self: Any, name: str, keys: Any, bag_size: int, grads: Any, scale: float):
        seen.append(grads)
        return original(self, name, keys, bag_size, grads, scale)

    monkeypatch.setattr(ModuleTables, "update_bags", watched)
    return seen


def test_concat_is_the_cat_of_the_outputs(local_client) -> None:
    model = Concat(local_client, "sgd", joined=True)
    batch = _batch(0)
    joined = model.pooled(*batch)
    parts = model.collection([batch[0], (batch[1], batch[2]), batch[0]])
    assert joined.shape == (BAGS, sum(DIMS))
    torch.testing.assert_close(joined, torch.cat(parts, dim=1), atol=0, rtol=0)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adam"])
def test_eager_concat_trains_as_the_cat_does(local_client, bag_grads, optimizer) -> None:
    """Table by table (``grouped=False``): each table's engine update gets its columns."""
    batches = [_batch(step) for step in range(4)]
    joined, split = (
        Concat(local_client, optimizer, joined=j, grouped=False) for j in (True, False)
    )
    expected = _train(split, split, batches)
    bag_grads.clear()
    got = _train(joined, joined, batches)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    for a, b in zip(joined.tables(), split.tables(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # each table's gradient is its column slice of the one gradient, not a copy
    assert len(bag_grads) == len(DIMS) * len(batches)
    assert all(g.stride() == (sum(DIMS), 1) for g in bag_grads)


@pytest.mark.parametrize(("backend", "ragged"), [("local", False), ("local", True), ("grpc", True)])
def test_compiled_concat_trains_as_eager(backend, ragged, request) -> None:
    """Losses and rows as eager's after K steps (ragged offsets: per-id rows pooled into
    the columns in some steps; gRPC: every table so)."""
    client = request.getfixturevalue(f"{backend}_client")
    torch._dynamo.reset()
    batches = [_batch(step, ragged and step % 2 == 1) for step in range(5)]
    eager, compiled = (Concat(client, "rowwise_adagrad", joined=True) for _ in range(2))
    expected = _train(eager, eager, batches)
    got = _train(compiled, torch.compile(compiled, backend="aot_eager", fullgraph=True), batches)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    for a, b in zip(compiled.tables(), eager.tables(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert not torch.equal(eager.tables()[0], _initial(DIMS[0]))  # the tables did train


def test_compiled_concat_is_one_op_each_way_with_no_cat(local_client, bag_grads) -> None:
    torch._dynamo.reset()
    model = Concat(local_client, "sgd", joined=True)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    compiled(*_batch(0)).backward()  # compiles
    bag_grads.clear()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled(*_batch(1)).backward()
    ran = {e.key for e in prof.key_averages()}
    assert {k for k in ran if k.startswith("recstore::")} == {
        "recstore::emb_pool_cat",
        "recstore::emb_update_pooled_cat",
    }
    assert "aten::cat" not in ran
    assert [g.stride() for g in bag_grads] == [(sum(DIMS), 1)] * len(DIMS)


def test_concat_has_no_graph_breaks(local_client) -> None:
    model = Concat(local_client, "adagrad", joined=True)
    torch._dynamo.reset()
    assert torch._dynamo.explain(model)(*_batch(0)).graph_break_count == 0


def test_pool_cat_op_shape_under_fake_tensors(local_client) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    bags = Concat(local_client, "sgd", joined=True).collection.bags
    handles = [bag._handle for bag in bags]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        grid, ids, offsets = (mode.from_tensor(t) for t in _batch(0))
        out = torch.ops.recstore.emb_pool_cat(
            bags[0]._anchor, handles, [grid.reshape(-1), ids, grid.reshape(-1)],
            [None, offsets, None], [SIZE, -1, SIZE], [False, True, False], [True] * 3,
        )  # fmt: skip
    assert tuple(out.shape) == (BAGS, sum(DIMS))


def test_concat_of_unequal_batches_is_refused_and_changes_nothing(local_client) -> None:
    model = Concat(local_client, "sgd", joined=True)
    before = [t.clone() for t in model.tables()]
    grid, ids, offsets = _batch(0)
    with pytest.raises(ValueError, match="same number of bags"):
        model.collection.concat([grid, (ids, offsets), grid[:2]])
    for table, old in zip(model.tables(), before, strict=True):
        torch.testing.assert_close(table, old, atol=0, rtol=0)
