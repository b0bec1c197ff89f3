"""A remote collection's step as one native call per direction (``recstore.client.remote_group``).

Over gRPC every table's distinct ids are found in one pass, pooled from one
multi-table pull in one call, and their gradients summed in one call and sent
as one multi-table update. The numbers must stay torch's
(``torch.nn.EmbeddingBag`` + ``torch.optim``) for every mix of widths, table
sizes, sum and mean, per-sample weights, ragged and empty bags, eagerly, with
prefetch and under ``torch.compile``; a refused id changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo

from recstore import nn as rnn
from recstore.client import bags as bag_kernels
from recstore.client.errors import IdOutOfRange
from recstore.client.remote.nodes import NodeCalls
from recstore.client.remote_group import RemoteGroup

from .conftest import unique_name
from .group_inputs import BAGS, mixed_features

#: (rows, dim, mode): widths 16..128, a 3-row table beside a 5000-row one
TABLES = [(50, 16, "sum"), (3, 32, "mean"), (5000, 64, "sum"), (40, 128, "mean"), (30, 16, "sum")]
OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), {"kind": "sgd", "lr": 0.1}),
    "adagrad": (lambda p: torch.optim.Adagrad(p, lr=0.1), {"kind": "adagrad", "lr": 0.1}),
}


def _start(index: int, rows: int, dim: int) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(index))


def _collection(client: Any, optimizer: Any) -> tuple[list[torch.nn.EmbeddingBag], Any]:
    reference, bags = [], []
    for i, (rows, dim, mode) in enumerate(TABLES):
        start = _start(i, rows, dim)
        reference.append(torch.nn.EmbeddingBag(rows, dim, mode=mode, _weight=start.clone()))
        bags.append(rnn.EmbeddingBag(rows, dim, mode=mode, _weight=start.clone(),
                                     name=unique_name("rg"), client=client,
                                     optimizer=optimizer))  # fmt: skip
    return reference, rnn.EmbeddingBagCollection(bags)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What a step calls: the group's two calls, the requests it sends, any table-by-table
    pooling."""
    seen: list[str] = []

    def spy_on(owner: Any, method: str, named: Any = None) -> None:
        original = getattr(owner, method)

        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(named(args) if named else method)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, method, spy)

    for method in ("pool", "update"):
        spy_on(RemoteGroup, method)
    for method in ("pool_distinct", "unpool_distinct"):
        spy_on(bag_kernels, method)
    spy_on(NodeCalls, "start", lambda args: args[1])  # a request to one node
    return seen


def _call(bag: torch.nn.EmbeddingBag, feature: Any) -> torch.Tensor:
    return bag(*feature) if isinstance(feature, tuple) else bag(feature)


@pytest.mark.parametrize("prefetch", [False, True], ids=["pulled", "prefetched"])
@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "no-weights"])
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_mixed_tables_train_like_torch_in_one_call_each_way(
    grpc_client, calls, optimizer_name, weighted, prefetch
) -> None:
    make_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    reference, collection = _collection(grpc_client, server_optimizer)
    assert isinstance(collection._group, RemoteGroup)
    optimizer = make_optimizer([p for bag in reference for p in bag.parameters()])
    if prefetch:
        collection.prefetch(mixed_features(0, weighted))
    for step in range(4):
        features = mixed_features(step, weighted)
        calls.clear()
        outputs = collection(features)
        expected = [_call(bag, f) for bag, f in zip(reference, features, strict=True)]
        for out, want in zip(outputs, expected, strict=True):
            torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        if prefetch:
            collection.prefetch(mixed_features(step + 1, weighted))
        target = [torch.linspace(-1, 1, o.numel()).view_as(o) for o in expected]
        sum(((o - t) ** 2).sum() for o, t in zip(outputs, target, strict=True)).backward()
        # one MultiPull per node for every table (sent by the last backward when prefetched,
        # carrying its updates), one pooling call, one gradient call
        pulled = [] if prefetch and step else ["MultiPull", "MultiPull"]
        sent = ["MultiPull", "MultiPull"] if prefetch else []
        assert calls == ["pool", *pulled, "update", *sent], calls
        optimizer.zero_grad()
        sum(((e - t) ** 2).sum() for e, t in zip(expected, target, strict=True)).backward()
        optimizer.step()
    for bag, ref in zip(collection.bags, reference, strict=True):
        torch.testing.assert_close(bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=1e-5)


def test_concat_and_shared_tables_match_torch(grpc_client) -> None:
    """A table serving two features, outputs joined side by side."""
    start = _start(7, 20, 16), _start(8, 9, 32)
    shared_ref = torch.nn.EmbeddingBag(20, 16, mode="sum", _weight=start[0].clone())
    other_ref = torch.nn.EmbeddingBag(9, 32, mode="mean", _weight=start[1].clone())
    shared = rnn.EmbeddingBag(20, 16, mode="sum", _weight=start[0].clone(), client=grpc_client,
                              name=unique_name("sh"), optimizer="sgd")  # fmt: skip
    other = rnn.EmbeddingBag(9, 32, mode="mean", _weight=start[1].clone(), client=grpc_client,
                             name=unique_name("ot"), optimizer="sgd")  # fmt: skip
    collection = rnn.EmbeddingBagCollection([shared, other, shared])
    assert isinstance(collection._group, RemoteGroup)
    optimizer = torch.optim.SGD([shared_ref.weight, other_ref.weight], lr=grpc_client.learning_rate)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        features = [torch.randint(0, 20, (4, 3), generator=g),
                    torch.randint(0, 9, (4, 2), generator=g),
                    torch.randint(0, 6, (4, 1), generator=g)]  # fmt: skip
        out = collection.concat(features)
        want = torch.cat([shared_ref(features[0]), other_ref(features[1]),
                          shared_ref(features[2])], 1)  # fmt: skip
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        target = torch.linspace(-1, 1, want.numel()).view_as(want)
        ((out - target) ** 2).sum().backward()
        optimizer.zero_grad()
        ((want - target) ** 2).sum().backward()
        optimizer.step()
    for bag, ref in ((shared, shared_ref), (other, other_ref)):
        torch.testing.assert_close(bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=1e-5)


def test_an_id_out_of_range_is_refused_naming_its_table_and_nothing_is_sent(
    grpc_client, calls
) -> None:
    bags = [rnn.EmbeddingBag(10, 16, mode="sum", client=grpc_client, name=unique_name("r"))
            for _ in range(2)]  # fmt: skip
    collection = rnn.EmbeddingBagCollection(bags)
    before = [bag.read_weights() for bag in bags]
    calls.clear()
    with pytest.raises(IdOutOfRange, match=bags[1].table_name):
        collection([torch.tensor([[1, 2]]), torch.tensor([[3, 10]])])
    assert calls == ["pool"]  # refused before any request
    for bag, old in zip(bags, before, strict=True):
        torch.testing.assert_close(bag.read_weights(), old, atol=0, rtol=0)


class _Model(torch.nn.Module):
    def __init__(self, client: Any) -> None:
        super().__init__()
        self.collection = rnn.EmbeddingBagCollection([
            rnn.EmbeddingBag(rows, dim, mode=mode, _weight=_start(i, rows, dim), client=client,
                             name=unique_name("cr"), optimizer="adagrad")
            for i, (rows, dim, mode) in enumerate(TABLES)
        ])  # fmt: skip

    def forward(self, ids: list[torch.Tensor]) -> torch.Tensor:
        return self.collection.concat(ids).pow(2).mean()


def test_compiled_remote_collection_trains_as_eager(grpc_client) -> None:
    torch._dynamo.reset()
    eager, compiled_model = _Model(grpc_client), _Model(grpc_client)
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    for step in range(3):
        g = torch.Generator().manual_seed(300 + step)
        ids = [torch.randint(0, rows, (BAGS, 1 + t % 3), generator=g)
               for t, (rows, *_) in enumerate(TABLES)]  # fmt: skip
        eager(ids).backward()
        compiled(ids).backward()
    for a, b in zip(eager.collection.bags, compiled_model.collection.bags, strict=True):
        torch.testing.assert_close(a.read_weights(), b.read_weights(), atol=1e-6, rtol=0)
    torch._dynamo.reset()
