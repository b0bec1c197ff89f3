"""A local collection's step as one engine call each way (``recstore.client.grouped``).

Every table of a collection of sum/mean bags over host tables is pooled by one
``TableGroup.pool`` and updated by one ``TableGroup.update``; the numbers must
stay torch's (``torch.nn.EmbeddingBag`` + ``torch.optim``) for every mix of
widths, row dtypes, table sizes, empty features, padding and per-sample
weights, eagerly and under ``torch.compile``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
from torch.profiler import ProfilerActivity, profile

from recstore import nn as rnn
from recstore.client.backends.local import LocalBackend
from recstore.client.errors import BackendError, IdOutOfRange
from recstore.client.grouped import TableGroup
from recstore.client.remote_group import RemoteGroup

from .conftest import unique_name
from .group_inputs import BAGS, mixed_features

#: (rows, dim, dtype, mode, padding_idx): widths 16..128, 16-bit rows, a 3-row table
TABLES = [
    (50, 16, torch.float32, "sum", None),
    (3, 32, torch.float32, "mean", None),
    (5000, 64, torch.float16, "sum", None),
    (40, 128, torch.bfloat16, "mean", 2),
    (30, 16, torch.float32, "mean", 0),
]
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), {"kind": "sgd", "lr": 0.1}),
    "adagrad": (lambda p: torch.optim.Adagrad(p, lr=0.1), {"kind": "adagrad", "lr": 0.1}),
}


def _start(index: int, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    weights = torch.randn(rows, dim, generator=torch.Generator().manual_seed(index))
    return weights.to(dtype)


def _collection(client: Any, optimizer: Any) -> tuple[list[torch.nn.EmbeddingBag], Any]:
    reference, bags = [], []
    for i, (rows, dim, dtype, mode, padding) in enumerate(TABLES):
        start = _start(i, rows, dim, dtype)
        if padding is not None:
            start[padding] = 0
        reference.append(torch.nn.EmbeddingBag(
            rows, dim, mode=mode, padding_idx=padding, _weight=start.float().clone()
        ))  # fmt: skip
        bags.append(rnn.EmbeddingBag(
            rows, dim, mode=mode, padding_idx=padding, _weight=start.clone(), dtype=dtype,
            name=unique_name("grp"), client=client, optimizer=optimizer,
        ))  # fmt: skip
    return reference, rnn.EmbeddingBagCollection(bags)


@pytest.fixture
def group_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The engine calls a step makes: grouped ones, and any table-by-table one."""
    calls: list[str] = []
    for method in ("pool_group", "update_group", "pool_bags", "update_bags", "pull_many",
                   "update_many"):  # fmt: skip
        original = getattr(LocalBackend, method)

        def spy(self, *args, _m=method, _f=original, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(_m)
            return _f(self, *args, **kwargs)

        monkeypatch.setattr(LocalBackend, method, spy)
    return calls


@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "no-weights"])
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_mixed_tables_train_like_torch_in_one_call_each_way(
    local_client, group_calls, optimizer_name, weighted
) -> None:
    make_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    reference, collection = _collection(local_client, server_optimizer)
    optimizer = make_optimizer([p for bag in reference for p in bag.parameters()])
    for step in range(4):
        features = mixed_features(step, weighted)
        group_calls.clear()
        outputs = collection(features)
        expected = [bag(*f) if isinstance(f, tuple) else bag(f)
                    for bag, f in zip(reference, features, strict=True)]  # fmt: skip
        for out, want, (_, _, dtype, _, _) in zip(outputs, expected, TABLES, strict=True):
            assert out.dtype == dtype
            torch.testing.assert_close(out.float(), want, atol=ATOL[dtype] * 4, rtol=1e-2)
        target = [torch.linspace(-1, 1, o.numel()).view_as(o) for o in expected]
        sum(((o.float() - t) ** 2).sum() for o, t in zip(outputs, target, strict=True)).backward()
        assert group_calls == ["pool_group", "update_group"]
        optimizer.zero_grad()
        sum(((e - t) ** 2).sum() for e, t in zip(expected, target, strict=True)).backward()
        optimizer.step()
        with torch.no_grad():  # the reference keeps its rows in the tables' dtypes too
            for bag, (_, _, dtype, _, _) in zip(reference, TABLES, strict=True):
                bag.weight.copy_(bag.weight.to(dtype).float())
    for bag, ref, (_, _, dtype, _, _) in zip(collection.bags, reference, TABLES, strict=True):
        torch.testing.assert_close(
            bag.read_weights().float(), ref.weight.detach(), atol=ATOL[dtype] * 8, rtol=1e-2
        )


def test_rowwise_adagrad_follows_the_formula_per_table(local_client) -> None:
    lr, eps = 0.1, 1e-8
    optimizer = {"kind": "rowwise_adagrad", "lr": lr, "eps": eps}
    dims, rows = (16, 64), 20
    starts = [_start(i, rows, dim, torch.float32) for i, dim in enumerate(dims)]
    bags = [
        rnn.EmbeddingBag(rows, dim, mode="sum", _weight=s.clone(), client=local_client,
                         name=unique_name("rw"), optimizer=optimizer)
        for s, dim in zip(starts, dims, strict=True)
    ]  # fmt: skip
    collection = rnn.EmbeddingBagCollection(bags)
    weights, states = [s.clone() for s in starts], [torch.zeros(rows) for _ in dims]
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        ids = [torch.randint(0, 4, (BAGS, 3), generator=g) for _ in dims]  # heavy duplicates
        target = torch.randn(BAGS, sum(dims), generator=g)
        (collection.concat(ids) * target).sum().backward()
        for t, (x, w, s) in enumerate(zip(ids, weights, states, strict=True)):
            cols = target[:, sum(dims[:t]) : sum(dims[: t + 1])]
            grad = torch.zeros_like(w).index_add_(0, x.reshape(-1), cols.repeat_interleave(3, 0))
            touched = torch.unique(x)
            s[touched] += (grad[touched] ** 2).mean(1)
            w[touched] -= lr * grad[touched] / (s[touched].sqrt() + eps).unsqueeze(1)
    for bag, w in zip(bags, weights, strict=True):
        torch.testing.assert_close(bag.read_weights(), w, atol=1e-5, rtol=0)


def test_unused_and_frozen_outputs_leave_their_tables(any_client, group_calls) -> None:
    """Locally and over gRPC (``recstore.client.remote_group``)."""
    start = _start(9, 10, 16, torch.float32)
    optimizer = {"kind": "sgd", "lr": 0.5, "weight_decay": 0.1}  # decay moves rows given any grad
    bags = [
        rnn.EmbeddingBag(10, 16, mode="sum", _weight=start.clone(), client=any_client,
                         name=unique_name("u"), optimizer=optimizer)
        for _ in range(3)
    ]  # fmt: skip
    bags[2].requires_grad_(False)
    collection = rnn.EmbeddingBagCollection(bags)
    local = any_client.backend == "local"
    assert isinstance(collection._group, TableGroup if local else RemoteGroup)
    ids = torch.tensor([[1, 2], [3, 3]])
    outputs = collection([ids, ids, ids])
    assert outputs[0].requires_grad and not outputs[2].requires_grad
    outputs[0].sum().backward()  # outputs[1] unused, bags[2] frozen
    assert group_calls == (["pool_group", "update_group"] if local else [])
    assert not torch.equal(bags[0].read_weights(), start)
    for bag in bags[1:]:
        torch.testing.assert_close(bag.read_weights(), start, atol=0, rtol=0)


def test_an_id_out_of_range_is_refused_naming_its_table(local_client) -> None:
    bags = [rnn.EmbeddingBag(10, 16, mode="sum", client=local_client, name=unique_name("r"))
            for _ in range(2)]  # fmt: skip
    collection = rnn.EmbeddingBagCollection(bags)
    before = [bag.read_weights() for bag in bags]
    with pytest.raises(IdOutOfRange, match=bags[1].table_name):
        collection([torch.tensor([[1, 2]]), torch.tensor([[3, 10]])])
    for bag, old in zip(bags, before, strict=True):
        torch.testing.assert_close(bag.read_weights(), old, atol=0, rtol=0)


class _Model(torch.nn.Module):
    def __init__(self, client: Any) -> None:
        super().__init__()
        self.collection = rnn.EmbeddingBagCollection([
            rnn.EmbeddingBag(rows, dim, mode=mode, _weight=_start(i, rows, dim, torch.float32),
                             client=client, name=unique_name("cg"), optimizer="adagrad")
            for i, (rows, dim, _, mode, _) in enumerate(TABLES)
        ])  # fmt: skip

    def forward(self, ids: list[torch.Tensor]) -> torch.Tensor:
        return self.collection.concat(ids).pow(2).mean()


def _grid(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(300 + step)
    return [torch.randint(0, rows, (BAGS, 1 + t % 3), generator=g)
            for t, (rows, *_) in enumerate(TABLES)]  # fmt: skip


def test_compiled_collection_is_one_op_each_way_and_trains_as_eager(local_client) -> None:
    torch._dynamo.reset()
    eager, compiled_model = _Model(local_client), _Model(local_client)
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    for step in range(3):
        eager(_grid(step)).backward()
        if step == 2:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                compiled(_grid(step)).backward()
        else:
            compiled(_grid(step)).backward()
    ran = {e.key for e in prof.key_averages() if e.key.startswith("recstore::")}
    assert ran == {"recstore::emb_pool_group", "recstore::emb_update_group"}
    for a, b in zip(eager.collection.bags, compiled_model.collection.bags, strict=True):
        torch.testing.assert_close(a.read_weights(), b.read_weights(), atol=1e-6, rtol=0)
    torch._dynamo.reset()
    assert torch._dynamo.explain(_Model(local_client))(_grid(0)).graph_break_count == 0


def test_a_non_finite_gradient_is_refused_and_changes_no_table(local_client) -> None:
    bags = [rnn.EmbeddingBag(10, 16, mode="sum", client=local_client, name=unique_name("n"),
                             optimizer="adagrad") for _ in range(2)]  # fmt: skip
    collection = rnn.EmbeddingBagCollection(bags)
    ids = [torch.tensor([[1, 2], [3, 4]]), torch.tensor([[5], [6]])]
    before = [bag.read_weights() for bag in bags]
    out = collection.concat(ids)
    poison = torch.ones_like(out)
    poison[1, 20] = float("nan")  # the second table's columns
    with pytest.raises(BackendError, match=bags[1].table_name) as refused:
        (out * poison).sum().backward()
    assert refused.value.reason and "NaN" in refused.value.reason
    for bag, old in zip(bags, before, strict=True):
        torch.testing.assert_close(bag.read_weights(), old, atol=0, rtol=0)
