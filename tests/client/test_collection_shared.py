"""A table shared by several features of an ``EmbeddingBagCollection``.

The reference is torch's: one ``torch.nn.EmbeddingBag`` applied to each of its
features, the loss summing them, ``torch.optim`` stepping once. The table's
gradient is the sum of its features' and each row gets one optimizer step per
step (with Adagrad, two steps would differ), whichever path the collection
takes: one grouped engine call each way, table by table, over gRPC, compiled.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo

from recstore import nn as rnn
from recstore.client.backends.local import LocalBackend

from .conftest import unique_name

OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), {"kind": "sgd", "lr": 0.1}),
    "adagrad": (lambda p: torch.optim.Adagrad(p, lr=0.1), {"kind": "adagrad", "lr": 0.1}),
}
#: (rows, dim, mode) of the shared table and of the ordinary one
SHARED, OTHER = (30, 16, "sum"), (20, 8, "mean")


def _start(seed: int, rows: int, dim: int) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))


def _features(step: int) -> list[Any]:
    """The shared table's two features overlap in ids (0..5); on odd steps the second is
    empty (bags with no ids at all); the ordinary table's feature between them."""
    g = torch.Generator().manual_seed(50 + step)
    second = (
        (torch.empty(0, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
        if step % 2
        else (torch.randint(0, 6, (7,), generator=g), torch.tensor([0, 2, 2, 5]))
    )
    return [torch.randint(0, 6, (4, 3), generator=g),
            torch.randint(0, 20, (4, 2), generator=g),
            second]  # fmt: skip


def _models(client: Any, server_optimizer: Any, grouped: bool = True) -> tuple[Any, ...]:
    shared_ref = torch.nn.EmbeddingBag(*SHARED[:2], mode=SHARED[2], _weight=_start(1, *SHARED[:2]))
    other_ref = torch.nn.EmbeddingBag(*OTHER[:2], mode=OTHER[2], _weight=_start(2, *OTHER[:2]))
    shared = rnn.EmbeddingBag(
        *SHARED[:2],
        mode=SHARED[2],
        _weight=_start(1, *SHARED[:2]),
        client=client,
        name=unique_name("sh"),
        optimizer=server_optimizer,
    )
    other = rnn.EmbeddingBag(
        *OTHER[:2],
        mode=OTHER[2],
        _weight=_start(2, *OTHER[:2]),
        client=client,
        name=unique_name("ot"),
        optimizer=server_optimizer,
    )
    collection = rnn.EmbeddingBagCollection([shared, other, shared], grouped=grouped)
    return collection, (shared_ref, other_ref, shared_ref), (shared, other)


def _call(bag: torch.nn.EmbeddingBag, feature: Any) -> torch.Tensor:
    return bag(*feature) if isinstance(feature, tuple) else bag(feature)


def _train(client: Any, optimizer_name: str, grouped: bool, joined: bool) -> None:
    make_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    collection, references, (shared, other) = _models(client, server_optimizer, grouped)
    assert collection.table_names == [shared.table_name, other.table_name]
    assert collection.feature_tables == [shared.table_name, other.table_name, shared.table_name]
    optimizer = make_optimizer([references[0].weight, references[1].weight])
    for step in range(4):
        features = _features(step)
        expected = [_call(bag, f) for bag, f in zip(references, features, strict=True)]
        if joined:
            outputs = [collection.concat(features)]
            expected = [torch.cat(expected, dim=1)]
        else:
            outputs = collection(features)
        for out, want in zip(outputs, expected, strict=True):
            torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        target = [torch.linspace(-1, 1, e.numel()).view_as(e) for e in expected]
        sum(((o - t) ** 2).sum() for o, t in zip(outputs, target, strict=True)).backward()
        optimizer.zero_grad()
        sum(((e - t) ** 2).sum() for e, t in zip(expected, target, strict=True)).backward()
        optimizer.step()
    for bag, ref in ((shared, references[0]), (other, references[1])):
        torch.testing.assert_close(bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("joined", [False, True], ids=["outputs", "concat"])
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_a_shared_table_trains_like_one_torch_bag_over_both_features_in_one_call(
    local_client, monkeypatch, optimizer_name, joined
) -> None:
    calls: list[str] = []
    for method in ("pool_group", "update_group", "pool_bags", "update_bags", "pull_many",
                   "update_many"):  # fmt: skip
        original = getattr(LocalBackend, method)

        def spy(self, *args, _m=method, _f=original, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(_m)
            return _f(self, *args, **kwargs)

        monkeypatch.setattr(LocalBackend, method, spy)
    _train(local_client, optimizer_name, grouped=True, joined=joined)
    assert calls == ["pool_group", "update_group"] * 4  # one call each way per step


@pytest.mark.parametrize("joined", [False, True], ids=["outputs", "concat"])
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_a_shared_table_trains_like_torch_table_by_table_and_remotely(
    any_client, optimizer_name, joined
) -> None:
    _train(any_client, optimizer_name, grouped=False, joined=joined)


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "by-table"])
def test_a_shared_table_takes_one_rowwise_adagrad_step_per_row(local_client, grouped) -> None:
    lr, eps, rows, dim = 0.1, 1e-8, 12, 16
    optimizer = {"kind": "rowwise_adagrad", "lr": lr, "eps": eps}
    start = _start(7, rows, dim)
    bag = rnn.EmbeddingBag(rows, dim, mode="sum", _weight=start.clone(), client=local_client,
                           name=unique_name("rw"), optimizer=optimizer)  # fmt: skip
    collection = rnn.EmbeddingBagCollection([bag, bag], grouped=grouped)
    weight, state = start.clone(), torch.zeros(rows)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        ids = [torch.randint(0, 4, (5, 3), generator=g) for _ in range(2)]  # overlapping
        target = torch.randn(5, 2 * dim, generator=g)
        (collection.concat(ids) * target).sum().backward()
        grad = torch.zeros_like(weight)
        for f, x in enumerate(ids):
            cols = target[:, f * dim : (f + 1) * dim]
            grad.index_add_(0, x.reshape(-1), cols.repeat_interleave(3, 0))
        touched = torch.unique(torch.cat(ids).reshape(-1))
        state[touched] += (grad[touched] ** 2).mean(1)
        weight[touched] -= lr * grad[touched] / (state[touched].sqrt() + eps).unsqueeze(1)
    torch.testing.assert_close(bag.read_weights(), weight, atol=1e-5, rtol=0)


class _Model(torch.nn.Module):
    def __init__(self, client: Any) -> None:
        super().__init__()
        shared = rnn.EmbeddingBag(
            *SHARED[:2],
            mode="mean",
            _weight=_start(3, *SHARED[:2]),
            client=client,
            name=unique_name("cs"),
            optimizer="adagrad",
        )
        other = rnn.EmbeddingBag(
            *OTHER[:2],
            mode="sum",
            _weight=_start(4, *OTHER[:2]),
            client=client,
            name=unique_name("co"),
            optimizer="adagrad",
        )
        self.collection = rnn.EmbeddingBagCollection([shared, other, shared])

    def forward(self, ids: list[torch.Tensor]) -> torch.Tensor:
        return self.collection.concat(ids).pow(2).mean()


def _grid(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(80 + step)
    return [torch.randint(0, 6, (4, 2), generator=g), torch.randint(0, 20, (4, 1), generator=g),
            torch.randint(0, 6, (4, 3), generator=g)]  # fmt: skip


def test_a_compiled_collection_with_a_shared_table_trains_as_eager(local_client) -> None:
    torch._dynamo.reset()
    eager, compiled_model = _Model(local_client), _Model(local_client)
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    for step in range(3):
        torch.testing.assert_close(compiled(_grid(step)), eager(_grid(step)), atol=1e-6, rtol=0)
        eager(_grid(step)).backward()
        compiled(_grid(step)).backward()
    for a, b in zip(eager.collection.bags, compiled_model.collection.bags, strict=True):
        torch.testing.assert_close(a.read_weights(), b.read_weights(), atol=1e-6, rtol=0)
    torch._dynamo.reset()


def test_bad_shared_declarations_are_refused(local_client) -> None:
    name = unique_name("dup")
    bag = rnn.EmbeddingBag(10, 4, client=local_client, name=name)
    again = rnn.EmbeddingBag(10, 4, client=local_client, name=name)
    with pytest.raises(ValueError, match="two different modules"):
        rnn.EmbeddingBagCollection([bag, again])
    config = rnn.EmbeddingBagConfig(10, 4, name=unique_name("cfg"))
    collection = rnn.EmbeddingBagCollection([config, config], client=local_client)
    assert len(collection.bags) == 1 and len(collection.feature_tables) == 2
    with pytest.raises(ValueError, match="2 bags but 1 features"):
        collection([torch.tensor([[1]])])
    with pytest.raises(ValueError, match="offsets"):
        rnn.EmbeddingBagCollection([bag, bag], grouped=False)(
            [torch.tensor([[1]]), (torch.tensor([1, 2]), torch.tensor([1]))]
        )
