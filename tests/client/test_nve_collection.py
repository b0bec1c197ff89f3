"""``recstore.nve.NVEmbeddingBagCollection``: the layers' own numerics, one request per node."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

import recstore.nve as nve
from recstore.client import RecStoreClient
from recstore.client.remote.nodes import NodeCalls

from .conftest import _client, unique_name

ROWS, DIM, STEPS = 50, 4, 4
#: (mode, config) of each layer: uncached, bounded staleness k = 0 and 2, chunked updates
LAYERS: list[tuple[str, dict[str, Any]]] = [
    ("sum", {}),
    ("mean", {"host_cache_size": 1 << 16, "max_staleness_steps": 2}),
    ("max", {"max_modify_size": 3}),
    ("sum", {"host_cache_size": 1 << 16, "max_staleness_steps": 0, "max_modify_size": 4}),
]
OPTIMIZERS = [{"kind": "sgd", "lr": 0.3}, {"kind": "rowwise_adagrad", "lr": 0.3}]


def _weight(index: int) -> torch.Tensor:
    return torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(index))


def _layers(client: RecStoreClient, optimizer: dict[str, Any]) -> list[nve.NVEmbeddingBag]:
    return [
        nve.NVEmbeddingBag(
            ROWS, DIM, weight_init=_weight(i), device="cpu", config=config, mode=mode,
            storage=nve.RemoteTable(client, unique_name("nvc"), optimizer=optimizer),
        )
        for i, (mode, config) in enumerate(LAYERS)
    ]  # fmt: skip


def _features(step: int) -> list[Any]:
    g = torch.Generator().manual_seed(900 + step)
    hot = torch.randint(0, 8, (6, 3), generator=g)  # few rows: the caches hit
    flat = torch.randint(0, ROWS, (11,), generator=g)
    flat[2] = flat[1]  # a repeat inside a bag
    offsets = torch.tensor([0, 4, 4, 7])  # one empty bag
    weighted = (flat, offsets, torch.rand(11, generator=g))
    return [hot, (flat, offsets), hot, weighted]


def _loss(outputs: list[torch.Tensor]) -> torch.Tensor:
    return sum((out * (i + 1)).square().sum() for i, out in enumerate(outputs))  # type: ignore[return-value]


def _call(layer: nve.NVEmbeddingBag, feature: Any) -> torch.Tensor:
    return layer(*feature) if isinstance(feature, tuple) else layer(feature)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o["kind"])
def test_collection_trains_exactly_as_the_layers_one_by_one(
    any_client: RecStoreClient, optimizer: dict[str, Any]
) -> None:
    alone = _layers(any_client, optimizer)
    together = nve.NVEmbeddingBagCollection(_layers(any_client, optimizer))
    for step in range(STEPS):
        features = _features(step)
        expected = [_call(layer, f) for layer, f in zip(alone, features, strict=True)]
        got = together(features)
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert torch.equal(a, b), f"step {step}, layer {index}"
        _loss(expected).backward()
        _loss(got).backward()
    for index, (a, b) in enumerate(zip(together.layers, alone, strict=True)):
        assert torch.equal(
            any_client.pull(a.storage.name, torch.arange(ROWS)),
            any_client.pull(b.storage.name, torch.arange(ROWS)),
        ), f"layer {index}"
        assert a.cache_stats() | {"table": "", "layer": ""} == b.cache_stats() | {
            "table": "",
            "layer": "",
        }


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Data-path requests the SDK sends, by method."""
    seen: Counter = Counter()
    start = NodeCalls.start

    def counting(self: NodeCalls, method: str, *args: Any, **kwargs: Any) -> Any:
        seen[method] += 1
        return start(self, method, *args, **kwargs)

    monkeypatch.setattr(NodeCalls, "start", counting)
    return seen


def test_one_multipull_per_node_and_step_updates_ride_on_it(
    grpc_client: RecStoreClient, calls: Counter
) -> None:
    layers = [
        nve.NVEmbeddingBag(ROWS, DIM, device="cpu",
                           storage=nve.RemoteTable(grpc_client, unique_name("nvc")))
        for _ in range(8)
    ]  # fmt: skip
    collection = nve.NVEmbeddingBagCollection(layers)
    ids = torch.arange(40).view(10, 4) % ROWS
    for _ in range(3):
        calls.clear()
        outputs = collection([ids] * len(layers))
        assert calls == {"MultiPull": 2}  # every layer, both nodes, last step's updates
        _loss(outputs).backward()
        assert calls == {"MultiPull": 2}  # held for the next pull
        assert grpc_client.ops.updates_in_flight == len(layers)


def test_cached_layers_send_only_their_misses(grpc_client: RecStoreClient, calls: Counter) -> None:
    config = {"host_cache_size": 1 << 16, "max_staleness_steps": 4}
    layers = [
        nve.NVEmbeddingBag(ROWS, DIM, device="cpu", config=config,
                           storage=nve.RemoteTable(grpc_client, unique_name("nvc")))
        for _ in range(3)
    ]  # fmt: skip
    collection = nve.NVEmbeddingBagCollection(layers)
    ids = torch.tensor([[1, 2], [2, 3]])
    collection([ids] * 3)
    calls.clear()
    collection([ids] * 3)  # every key a hit, in every layer
    assert calls == {}
    assert all(layer.cache_stats()["hits"] == 3 for layer in layers)


def test_bad_input_is_refused_before_anything_moves(grpc_client: RecStoreClient) -> None:
    config = {"host_cache_size": 1 << 16, "max_staleness_steps": 1}
    layers = [
        nve.NVEmbeddingBag(ROWS, DIM, device="cpu", config=config,
                           storage=nve.RemoteTable(grpc_client, unique_name("nvc")))
        for _ in range(2)
    ]  # fmt: skip
    collection = nve.NVEmbeddingBagCollection(layers)
    good = torch.tensor([[1, 2]])
    with pytest.raises(IndexError, match=rf"\[0, {ROWS}\)"):
        collection([good, torch.tensor([[1, ROWS]])])
    with pytest.raises(ValueError, match="2 layers but 1 features"):
        collection([good])
    assert [layer._cached.step for layer in layers] == [0, 0]  # type: ignore[union-attr]
    assert [layer.cache_stats()["lookups"] for layer in layers] == [0, 0]


def test_collection_rules(grpc_client: RecStoreClient, ps_endpoints: list[str]) -> None:
    def layer(client: RecStoreClient, name: str | None = None) -> nve.NVEmbeddingBag:
        storage = nve.RemoteTable(client, name or unique_name("nvc"))
        return nve.NVEmbeddingBag(ROWS, DIM, device="cpu", storage=storage)

    with pytest.raises(ValueError, match="at least one layer"):
        nve.NVEmbeddingBagCollection([])
    other = _client("grpc", ps_endpoints)
    try:
        with pytest.raises(ValueError, match="same RecStoreClient"):
            nve.NVEmbeddingBagCollection([layer(grpc_client), layer(other)])
        for name in other.data_name_list():
            other.delete_data(name)
    finally:
        other.close()
    shared = unique_name("nvc")
    with pytest.raises(ValueError, match="only once"):
        nve.NVEmbeddingBagCollection([layer(grpc_client, shared), layer(grpc_client, shared)])
    embedding = nve.NVEmbedding(
        ROWS, DIM, device="cpu", storage=nve.RemoteTable(grpc_client, unique_name("nvc"))
    )
    with pytest.raises(TypeError, match="NVEmbeddingBag, got NVEmbedding"):
        nve.NVEmbeddingBagCollection([embedding])  # type: ignore[list-item]


def test_a_bag_pulls_and_updates_each_distinct_key_once(
    local_client: RecStoreClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bag pools from its distinct keys' rows: torch's pooling backward sums each key's
    gradient, so the update carries one row per key and needs no summing of its own."""
    layer = nve.NVEmbeddingBag(
        ROWS, DIM, device="cpu", storage=nve.RemoteTable(local_client, unique_name("nvc"))
    )
    tables = local_client._for_modules
    pulled: list[int] = []
    updated: list[tuple[int, bool]] = []
    pull_many, apply_gradients = tables.pull_many, tables.apply_gradients
    monkeypatch.setattr(
        tables, "pull_many", lambda r: (pulled.extend(len(k) for _, k, _ in r), pull_many(r))[1]
    )
    monkeypatch.setattr(
        tables,
        "apply_gradients",
        lambda u: (updated.extend((len(k), q) for _, k, _, q in u), apply_gradients(u))[1],
    )
    keys = torch.tensor([[3, 5, 3], [9, 3, 5]])
    before = local_client.pull(layer.storage.name, torch.arange(ROWS))
    layer(keys).sum().backward()
    assert pulled == [3] and updated == [(3, True)]
    counts = torch.bincount(keys.reshape(-1), minlength=ROWS).unsqueeze(1).float()
    expected = before - local_client.learning_rate * counts
    torch.testing.assert_close(local_client.pull(layer.storage.name, torch.arange(ROWS)), expected)
