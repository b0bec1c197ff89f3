"""Fixed-size bags pooled in the engine: one row per bag each way, torch's numbers.

On the local backend plain bags of one size are pooled by the engine and
their backward sends one gradient row per bag (``recstore.client.pooled``);
training must still match torch.nn + torch.optim, also when ids repeat a lot.
"""

from __future__ import annotations

import pytest
import torch

from recstore import nn as rnn

from .conftest import unique_name

NUM, DIM, BAGS, BAG_SIZE = 50, 4, 64, 5


def _heavy_ids(seed: int) -> torch.Tensor:
    """Bags whose ids repeat a lot (a few hot ids), as Zipf traffic does."""
    g = torch.Generator().manual_seed(seed)
    hot = torch.randint(0, NUM, (6,), generator=g)
    return hot[torch.randint(0, 6, (BAGS, BAG_SIZE), generator=g)]


def test_local_bags_pool_in_the_engine(local_client, monkeypatch) -> None:
    """No row per occurrence leaves the table and no gradient row per occurrence goes back:
    the step is one ``pool_bags`` and one ``update_bags`` of [bags, dim] rows."""
    bag = rnn.EmbeddingBag(
        NUM, DIM, mode="sum", name=unique_name("pooled"), client=local_client,
        optimizer={"kind": "sgd", "lr": 0.1},
    )  # fmt: skip
    backend = local_client._backend()
    calls: list[tuple[str, tuple[int, ...]]] = []
    for method in ("pull_many", "update_many"):
        monkeypatch.setattr(backend, method, lambda *a, m=method, **k: calls.append((m, ())))
    for method in ("pool_bags", "update_bags"):
        original = getattr(backend, method)

        def spy(name, keys, bag_size, *rest, _m=method, _f=original):  # type: ignore[no-untyped-def]
            result = _f(name, keys, bag_size, *rest)
            rows = rest[0] if _m == "update_bags" else result
            calls.append((_m, tuple(rows.shape)))
            return result

        monkeypatch.setattr(backend, method, spy)
    bag(_heavy_ids(0)).sum().backward()
    assert calls == [("pool_bags", (BAGS, DIM)), ("update_bags", (BAGS, DIM))]


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_collection_with_heavy_duplicates_trains_like_torch(any_client, mode: str) -> None:
    weights = [torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(i)) for i in (1, 2)]
    reference = [torch.nn.EmbeddingBag(NUM, DIM, mode=mode, _weight=w.clone()) for w in weights]
    bags = [
        rnn.EmbeddingBag(
            NUM,
            DIM,
            mode=mode,
            _weight=w.clone(),
            name=unique_name("heavy"),
            client=any_client,
            optimizer={"kind": "sgd", "lr": 0.01},
        )
        for w in weights
    ]
    collection = rnn.EmbeddingBagCollection(bags)
    optimizer = torch.optim.SGD([p for r in reference for p in r.parameters()], lr=0.01)
    for step in range(4):
        ids = [_heavy_ids(10 * step + i) for i in range(2)]
        target = torch.linspace(-1, 1, BAGS * DIM).view(BAGS, DIM)
        outs = collection(ids)
        expected = [r(x) for r, x in zip(reference, ids, strict=True)]
        for out, want in zip(outs, expected, strict=True):
            torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-6)
        sum(((o - target) ** 2).sum() for o in outs).backward()
        optimizer.zero_grad()
        sum(((e - target) ** 2).sum() for e in expected).backward()
        optimizer.step()
    any_client.flush()
    for bag, ref in zip(bags, reference, strict=True):
        torch.testing.assert_close(bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=1e-6)


def test_rowwise_adagrad_bags_follow_the_formula(local_client) -> None:
    lr, eps = 0.1, 1e-8
    start = torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(5))
    bag = rnn.EmbeddingBag(
        NUM, DIM, mode="sum", _weight=start.clone(), name=unique_name("rowwise"),
        client=local_client, optimizer={"kind": "rowwise_adagrad", "lr": lr, "eps": eps},
    )  # fmt: skip
    weight, state = start.clone(), torch.zeros(NUM)
    for step in range(3):
        ids = _heavy_ids(step)
        target = torch.randn(BAGS, DIM, generator=torch.Generator().manual_seed(50 + step))
        (bag(ids) * target).sum().backward()
        grad = torch.zeros(NUM, DIM).index_add_(
            0, ids.reshape(-1), target.repeat_interleave(BAG_SIZE, 0)
        )
        rows = torch.unique(ids)
        state[rows] += (grad[rows] ** 2).mean(1)
        weight[rows] -= lr * grad[rows] / (state[rows].sqrt() + eps).unsqueeze(1)
    torch.testing.assert_close(bag.read_weights(), weight, atol=1e-5, rtol=0)


def test_offsets_shared_by_tables_are_checked_once(local_client, monkeypatch) -> None:
    """A traced batch of separate bags hands every table the batch's one offsets tensor:
    the op's kernels check it for one bag size once per call, forward and backward."""
    from recstore.client import pooled

    bags = [rnn.EmbeddingBag(NUM, DIM, mode="sum", client=local_client,
                             name=unique_name("s")) for _ in range(3)]  # fmt: skip
    ids = [torch.randint(0, NUM, (BAGS * BAG_SIZE,)) for _ in bags]
    offsets = torch.arange(0, BAGS * BAG_SIZE, BAG_SIZE)
    checks = []
    original = pooled.uniform_bag_size

    def counted(offs: torch.Tensor, lookups: int) -> int:
        checks.append(lookups)
        return original(offs, lookups)

    monkeypatch.setattr(pooled, "uniform_bag_size", counted)
    handles, pools = [b._handle for b in bags], [pooled.Pool(pooled.SEGMENTS, False)] * 3
    out = pooled.pool_bags(handles, ids, [offsets] * 3, pools)
    expected = [
        b.weight[i].view(BAGS, BAG_SIZE, DIM).sum(1) for b, i in zip(bags, ids, strict=True)
    ]
    torch.testing.assert_close(out, expected)
    stored = [b.weight for b in bags]
    pooled.send_bag_gradients(handles, ids, [offsets] * 3, pools, [torch.ones_like(o) for o in out])
    assert checks == [BAGS * BAG_SIZE] * 2  # once in the forward, once in the backward
    assert all(
        not torch.equal(b.weight, s) for b, s in zip(bags, stored, strict=True)
    )  # engine updated
