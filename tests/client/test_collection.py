"""EmbeddingBagCollection: torch's numerics, one request per node and step, pending semantics."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import torch

from recstore import nn as rnn
from recstore.client import BackendError, RecStoreClient, pooled
from recstore.client.remote.nodes import NodeCalls
from recstore.client.remote.updates import CARRY_ENV, FAILED_NOTE
from recstore.core import SlotMap, SlotRange

from .conftest import HELD_UNTIL_TAKEN_MS, _client, unique_name

NUM, DIM, STEPS = 60, 6, 5
OPTIMIZERS = {
    "sgd": (lambda params: torch.optim.SGD(params, lr=0.1), {"kind": "sgd", "lr": 0.1}),
    "adagrad": (lambda params: torch.optim.Adagrad(params, lr=0.1), {"kind": "adagrad", "lr": 0.1}),
}
#: (mode, options) of each bag: the fixed-size fast path and torch's general one
BAGS = [("sum", {}), ("mean", {"padding_idx": 5}), ("max", {}), ("sum", {}), ("mean", {})]


def _weights(index: int) -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(index))


def _features(step: int) -> list[Any]:
    g = torch.Generator().manual_seed(500 + step)
    ids = torch.randint(0, NUM, (17,), generator=g)
    ids[3] = ids[4]  # a duplicate inside a bag
    general = (ids, torch.tensor([0, 3, 3, 9, 12]))  # one empty bag
    fixed = (torch.randint(0, NUM, (20,), generator=g), torch.arange(0, 20, 4))
    weighted = (*fixed, torch.rand(20, generator=g))
    return [weighted, general, general, torch.randint(0, NUM, (5, 3), generator=g), fixed]


def _models(client: Any, server_optimizer: Any) -> tuple[list[torch.nn.EmbeddingBag], Any]:
    reference = [
        torch.nn.EmbeddingBag(NUM, DIM, mode=mode, _weight=_weights(i), **options)
        for i, (mode, options) in enumerate(BAGS)
    ]
    bags = [
        rnn.EmbeddingBag(
            NUM, DIM, mode=mode, _weight=_weights(i), **options, name=unique_name("ebc"),
            client=client, optimizer=server_optimizer,
        )
        for i, (mode, options) in enumerate(BAGS)
    ]  # fmt: skip
    return reference, rnn.EmbeddingBagCollection(bags)


def _torch_outputs(reference: list[torch.nn.EmbeddingBag], features: list[Any]) -> list[Any]:
    return [
        bag(*f) if isinstance(f, tuple) else bag(f)
        for bag, f in zip(reference, features, strict=True)
    ]


def _loss(outputs: list[torch.Tensor], used: int) -> torch.Tensor:
    # the last bag's output is left out of the loss: it gets no gradient and no update
    return sum(((out - 0.3 * i) ** 2).sum() for i, out in enumerate(outputs[:used]))  # type: ignore[return-value]


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_training_matches_torch(any_client, optimizer_name) -> None:
    make_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    reference, collection = _models(any_client, server_optimizer)
    optimizer = make_optimizer([p for bag in reference for p in bag.parameters()])
    assert list(collection.parameters()) == []  # a dense optimizer never sees the tables
    for step in range(STEPS):
        features = _features(step)
        expected = _torch_outputs(reference, features)
        got = collection(features)
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"bag {index}, step {step}")
        optimizer.zero_grad()
        _loss(expected, len(BAGS) - 1).backward()
        optimizer.step()
        _loss(got, len(BAGS) - 1).backward()
    for index, (bag, ref) in enumerate(zip(collection.bags, reference, strict=True)):
        torch.testing.assert_close(
            bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=0, msg=f"bag {index}"
        )
    torch.testing.assert_close(collection.bags[-1].read_weights(), _weights(len(BAGS) - 1))


@pytest.mark.parametrize("joined", [True, False])
def test_backward_sums_gradients_over_the_forwards_distinct_keys(grpc_client, monkeypatch, joined):
    """Remote bags of one size pooled from distinct rows: backward sums each distinct id's
    gradient over the keys and inverse the forward found, not a second search."""
    modes = ["sum", "mean", "sum"]
    reference = [torch.nn.EmbeddingBag(NUM, DIM, mode=m, _weight=_weights(i))
                 for i, m in enumerate(modes)]  # fmt: skip
    collection = rnn.EmbeddingBagCollection([
        rnn.EmbeddingBag(NUM, DIM, mode=m, _weight=_weights(i), name=unique_name("ebc"),
                         client=grpc_client, optimizer={"kind": "sgd", "lr": 0.1})
        for i, m in enumerate(modes)
    ])  # fmt: skip
    optimizer = torch.optim.SGD([p for bag in reference for p in bag.parameters()], lr=0.1)

    def searched_again(keys: torch.Tensor) -> Any:
        raise AssertionError("the backward searched the distinct keys again")

    for step in range(STEPS):
        g = torch.Generator().manual_seed(700 + step)
        features = [torch.randint(0, NUM, (6, 3), generator=g) for _ in modes]
        expected = torch.cat([bag(f) for bag, f in zip(reference, features, strict=True)], 1)
        got = collection.concat(features) if joined else torch.cat(collection(features), 1)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        optimizer.zero_grad()
        (expected * torch.linspace(-1, 1, expected.shape[1])).sum().backward()
        optimizer.step()
        with monkeypatch.context() as patch:
            patch.setattr(pooled, "unique_keys", searched_again)
            (got * torch.linspace(-1, 1, got.shape[1])).sum().backward()
    for index, (bag, ref) in enumerate(zip(collection.bags, reference, strict=True)):
        torch.testing.assert_close(
            bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=0, msg=f"bag {index}"
        )


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_training_with_prefetch_matches_torch(any_client, optimizer_name, calls) -> None:
    """The next batch named before backward: its rows leave with the step's gradients."""
    make_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    reference, collection = _models(any_client, server_optimizer)
    optimizer = make_optimizer([p for bag in reference for p in bag.parameters()])
    got = collection(_features(0))
    for step in range(STEPS):
        expected = _torch_outputs(reference, _features(step))
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"bag {index}, step {step}")
        optimizer.zero_grad()
        _loss(expected, len(BAGS) - 1).backward()
        optimizer.step()
        collection.prefetch(_features(step + 1))  # equal features, other tensor objects
        calls.clear()
        _loss(got, len(BAGS) - 1).backward()
        got = collection(_features(step + 1))
        if any_client.backend == "grpc":  # one request per node, sent by backward
            assert calls == {"MultiPull": 2}
    for index, (bag, ref) in enumerate(zip(collection.bags, reference, strict=True)):
        torch.testing.assert_close(
            bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=0, msg=f"bag {index}"
        )


@pytest.mark.parametrize(
    "meanwhile", ["update", "push", "pull", "other features", "prefetch after backward"]
)
def test_prefetched_rows_are_used_only_while_current(grpc_client, meanwhile) -> None:
    reference, collection = _models(grpc_client, {"kind": "sgd", "lr": 0.1})
    optimizer = torch.optim.SGD([p for bag in reference for p in bag.parameters()], lr=0.1)
    features = _features(0)
    got = collection(features)
    optimizer.zero_grad()
    _loss(_torch_outputs(reference, features), len(BAGS)).backward()
    optimizer.step()
    following = _features(1)
    if meanwhile != "prefetch after backward":
        collection.prefetch(following)
    _loss(got, len(BAGS)).backward()  # sends the prefetch with the gradients
    table, ids = collection.table_names[1], torch.unique(following[1][0])[:3]  # looked up next
    if meanwhile == "update":
        grpc_client.update(table, ids, torch.ones(3, DIM))
        with torch.no_grad():
            reference[1].weight[ids] -= 0.1 * torch.ones(3, DIM)  # the table's sgd, lr 0.1
    elif meanwhile == "push":
        grpc_client.push(table, ids, torch.full((3, DIM), 2.5))
        with torch.no_grad():
            reference[1].weight[ids] = 2.5
    elif meanwhile == "pull":
        grpc_client.pull(table, ids)
    elif meanwhile == "other features":
        following = _features(2)
    else:
        collection.prefetch(following)  # held updates leave now, with these pulls
    got = collection(following)
    for index, (a, b) in enumerate(zip(got, _torch_outputs(reference, following), strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"bag {index}")


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """Data-path requests the SDK sends, by method."""
    seen: Counter = Counter()
    start = NodeCalls.start

    def counting(self, method, *args, **kwargs):
        seen[method] += 1
        return start(self, method, *args, **kwargs)

    monkeypatch.setattr(NodeCalls, "start", counting)
    return seen


@pytest.fixture
def uncarried_client(ps_endpoints, monkeypatch) -> Iterator[RecStoreClient]:
    """A gRPC client that sends every update at once (carrying switched off)."""
    monkeypatch.setenv(CARRY_ENV, "0")
    client = _client("grpc", ps_endpoints)
    yield client
    for name in client.data_name_list():
        client.delete_data(name)
    client.close()


def test_one_request_per_node_and_step_updates_ride_on_the_next_pull(grpc_client, calls) -> None:
    reference, collection = _models(grpc_client, {"kind": "sgd", "lr": 0.1})
    for step in range(3):
        calls.clear()
        outputs = collection(_features(step))
        assert calls == {"MultiPull": 2}  # every table, both shards (and last step's updates)
        _loss(outputs, len(BAGS)).backward()
        assert calls == {"MultiPull": 2}  # held for the next pull
        assert grpc_client.ops.updates_in_flight == len(BAGS)
    _check_read_your_writes(grpc_client, reference, collection)


def test_without_carrying_updates_go_at_once(uncarried_client, calls) -> None:
    reference, collection = _models(uncarried_client, {"kind": "sgd", "lr": 0.1})
    for step in range(3):
        calls.clear()
        outputs = collection(_features(step))
        assert calls == {"MultiPull": 2}
        _loss(outputs, len(BAGS)).backward()
        assert calls == {"MultiPull": 2, "MultiUpdate": 2}
    _check_read_your_writes(uncarried_client, reference, collection)


def _check_read_your_writes(client: Any, reference: Any, collection: Any) -> None:
    # read-your-writes: the updates still in flight are applied before any read
    optimizer = torch.optim.SGD([p for bag in reference for p in bag.parameters()], lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        features = _features(step)
        _loss(_torch_outputs(reference, features), len(BAGS)).backward()
        optimizer.step()
    ids = torch.arange(NUM)
    for bag, ref in zip(collection.bags, reference, strict=True):
        torch.testing.assert_close(
            client.pull(bag.table_name, ids), ref.weight.detach(), atol=1e-5, rtol=0
        )


def test_held_updates_go_on_their_own_when_no_pull_comes(ps_endpoints, monkeypatch) -> None:
    monkeypatch.setenv(CARRY_ENV, "5")
    client = _client("grpc", ps_endpoints)
    try:
        reference, collection = _models(client, {"kind": "sgd", "lr": 0.1})
        sent_alone = threading.Event()
        carried = client.ops._step._carried
        send = carried._send

        def sending(calls: Any) -> None:
            send(calls)
            sent_alone.set()

        monkeypatch.setattr(carried, "_send", sending)
        features = _features(0)
        _loss(collection(features), len(BAGS)).backward()
        assert sent_alone.wait(timeout=30)  # by the timer: nothing else was called
        assert len(carried) == 0
        optimizer = torch.optim.SGD([p for bag in reference for p in bag.parameters()], lr=0.1)
        _loss(_torch_outputs(reference, features), len(BAGS)).backward()
        optimizer.step()
        for bag, ref in zip(collection.bags, reference, strict=True):
            torch.testing.assert_close(bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=0)
    finally:
        for name in client.data_name_list():
            client.delete_data(name)
        client.close()


CARRY_DELAYS = {  # RECSTORE_UPDATE_CARRY_MS for each way a backward's update can leave
    "rides on the pull": HELD_UNTIL_TAKEN_MS,
    "sent by the timer": "1",
    "sent at once": "0",
}


@pytest.mark.parametrize("carry", list(CARRY_DELAYS))
def test_an_update_of_a_dropped_table_fails_the_next_step(ps_endpoints, monkeypatch, carry) -> None:
    monkeypatch.setenv(CARRY_ENV, CARRY_DELAYS[carry])
    client = _client("grpc", ps_endpoints)
    try:
        _, collection = _models(client, {"kind": "sgd", "lr": 0.1})
        outputs = collection(_features(0))
        before = [bag.read_weights() for bag in collection.bags[1:]]
        _drop_behind_the_clients_back(ps_endpoints, collection.table_names[0])
        timer_sent = threading.Event()
        if carry == "sent by the timer":
            send = client.ops._step._carried._send
            monkeypatch.setattr(
                client.ops._step._carried, "_send", lambda calls: (send(calls), timer_sent.set())
            )
        _loss(outputs, len(BAGS)).backward()
        assert client.ops.updates_in_flight == len(BAGS)  # held, or sent and not collected
        if carry == "sent by the timer":
            assert timer_sent.wait(timeout=60)
        with pytest.raises(BackendError) as info:
            collection(_features(1))  # the update was refused whole, at every node
        assert info.value.code == "NOT_FOUND"
        assert client.ops.updates_in_flight == 0  # every table's failure reported by this step
        for bag, rows in zip(collection.bags[1:], before, strict=True):  # nothing applied
            torch.testing.assert_close(bag.read_weights(), rows)
        client.flush()  # and nothing left to report
    finally:
        for name in client.data_name_list():
            client.delete_data(name)
        client.close()


def _drop_behind_the_clients_back(ps_endpoints: list[str], name: str) -> None:
    from recstore.client import RecStoreClient

    other = RecStoreClient(role=unique_name("other"))
    try:
        other.set_ps_endpoints(ps_endpoints)
        other.init_data(name, (NUM, DIM), torch.float32)  # adopts the existing table
        other.delete_data(name)
    finally:
        other.close()


def test_stale_slot_maps_are_refreshed_and_the_refused_items_resent(grpc_client) -> None:
    reference, collection = _models(grpc_client, {"kind": "sgd", "lr": 0.1})
    swapped = SlotMap(epoch=0, ranges=tuple(
        SlotRange(r.start, r.end, 1 - r.shard) for r in SlotMap.initial(2).ranges
    ))  # fmt: skip
    for name in collection.table_names[:2]:  # every key of two tables goes to the wrong node
        grpc_client.ops._locate(name).router._slot_map = swapped
    features = _features(0)
    got = collection(features)
    expected = _torch_outputs(reference, features)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for name in collection.table_names[2:4]:
        grpc_client.ops._locate(name).router._slot_map = swapped
    _loss(got, len(BAGS)).backward()
    grpc_client.flush()
    optimizer = torch.optim.SGD([p for bag in reference for p in bag.parameters()], lr=0.1)
    _loss(expected, len(BAGS)).backward()
    optimizer.step()
    for bag, ref in zip(collection.bags, reference, strict=True):
        assert grpc_client.ops._locate(bag.table_name).router.slot_map.epoch == 1
        torch.testing.assert_close(bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=0)


def test_a_failed_background_update_is_raised_once_per_table(grpc_client, ps_endpoints) -> None:
    _, collection = _models(grpc_client, {"kind": "sgd", "lr": 0.1})
    outputs = collection(_features(0))
    before = [bag.read_weights() for bag in collection.bags]
    _drop_behind_the_clients_back(ps_endpoints, collection.table_names[0])
    _loss(outputs, len(BAGS)).backward()  # sent in the background: both nodes refuse it whole
    for name in collection.table_names[1:]:
        with pytest.raises(BackendError) as info:
            grpc_client.pull(name, torch.tensor([1]))
        assert FAILED_NOTE in info.value.__notes__
        assert info.value.code == "NOT_FOUND"
    # reported once; nothing of the refused request was applied to the other tables
    for bag, rows in zip(collection.bags[1:], before[1:], strict=True):
        torch.testing.assert_close(bag.read_weights(), rows)


def test_frozen_bags_and_no_grad_lookups_do_not_update(any_client) -> None:
    weights = _weights(0)
    frozen = rnn.EmbeddingBag(
        NUM, DIM, mode="sum", _weight=weights.clone(), _freeze=True, client=any_client,
        name=unique_name(),
    )  # fmt: skip
    trainable = rnn.EmbeddingBag(
        NUM, DIM, mode="sum", _weight=weights.clone(), client=any_client, name=unique_name(),
        optimizer={"kind": "sgd", "lr": 0.1},
    )  # fmt: skip
    collection = rnn.EmbeddingBagCollection([frozen, trainable])
    ids = torch.tensor([[1, 2], [3, 3]])
    with torch.no_grad():
        outputs = collection([ids, ids])
    assert not any(out.requires_grad for out in outputs)
    outputs = collection([ids, ids])
    assert not outputs[0].requires_grad and outputs[1].requires_grad
    outputs[1].sum().backward()
    torch.testing.assert_close(frozen.weight, weights)
    expected = weights.clone()
    expected[[1, 2]] -= 0.1
    expected[3] -= 0.2
    torch.testing.assert_close(trainable.weight, expected)


def test_configs_build_bags_on_the_given_client(any_client) -> None:
    configs = [
        rnn.EmbeddingBagConfig(NUM, DIM, name=unique_name(), mode="sum", seed=1),
        rnn.EmbeddingBagConfig(
            NUM, 4, name=unique_name(), optimizer={"kind": "adagrad", "lr": 0.1}
        ),
    ]
    collection = rnn.EmbeddingBagCollection(configs, client=any_client)
    assert collection.table_names == [c.name for c in configs]
    outputs = collection([torch.tensor([[1, 2]]), (torch.tensor([3, 4, 5]), torch.tensor([0, 1]))])
    assert [tuple(o.shape) for o in outputs] == [(1, DIM), (2, 4)]


def test_bad_collections_and_inputs_are_refused(local_client, any_client) -> None:
    bag = rnn.EmbeddingBag(NUM, DIM, client=local_client, name=unique_name())
    with pytest.raises(ValueError, match="at least one"):
        rnn.EmbeddingBagCollection([])
    with pytest.raises(ValueError, match="two different modules"):
        rnn.EmbeddingBagCollection([bag, rnn.EmbeddingBag(NUM, DIM, client=local_client,
                                                          name=bag.table_name)])  # fmt: skip
    with pytest.raises(TypeError, match="EmbeddingBagConfig"):
        rnn.EmbeddingBagCollection([torch.nn.EmbeddingBag(NUM, DIM)])
    if any_client is not local_client:
        elsewhere = rnn.EmbeddingBag(NUM, DIM, client=any_client, name=unique_name())
        with pytest.raises(ValueError, match="same RecStoreClient"):
            rnn.EmbeddingBagCollection([bag, elsewhere])
    collection = rnn.EmbeddingBagCollection([bag])
    with pytest.raises(ValueError, match="1 bags but 2 features"):
        collection([torch.tensor([[1]]), torch.tensor([[1]])])
    with pytest.raises(TypeError, match="each feature"):
        collection([[1, 2, 3, 4]])
    before = bag.weight
    with pytest.raises(ValueError, match="out of range"):
        collection([torch.tensor([[1, NUM]])])
    torch.testing.assert_close(bag.weight, before)


def test_held_updates_still_go_when_the_pull_they_ride_cannot(grpc_client, monkeypatch) -> None:
    reference, collection = _models(grpc_client, {"kind": "sgd", "lr": 0.1})
    features = _features(0)
    _loss(collection(features), len(BAGS)).backward()  # held, to ride on the next pull
    steps = grpc_client.ops._step
    locate = steps._locate

    def lost(name: str) -> Any:
        raise BackendError(f"cannot find {name}", code=grpc.StatusCode.UNAVAILABLE)

    monkeypatch.setattr(steps, "_locate", lost)
    with pytest.raises(BackendError, match="cannot find"):
        collection(_features(1))
    monkeypatch.setattr(steps, "_locate", locate)
    optimizer = torch.optim.SGD([p for bag in reference for p in bag.parameters()], lr=0.1)
    _loss(_torch_outputs(reference, features), len(BAGS)).backward()
    optimizer.step()
    for bag, ref in zip(collection.bags, reference, strict=True):  # the updates landed
        torch.testing.assert_close(bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=0)


def test_single_bags_send_their_updates_with_the_next_pull(grpc_client, calls) -> None:
    """Bags used one by one (no collection): one MultiPull per bag and node, nothing else."""
    reference, collection = _models(grpc_client, {"kind": "sgd", "lr": 0.1})
    bags = list(collection.bags)
    optimizer = torch.optim.SGD([p for bag in reference for p in bag.parameters()], lr=0.1)
    for step in range(3):
        features = _features(step)
        calls.clear()
        got = _torch_outputs(bags, features)  # each bag's own forward
        assert calls == {"MultiPull": 2 * len(bags)}  # the last step's updates rode along
        expected = _torch_outputs(reference, features)
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"bag {index}, step {step}")
        optimizer.zero_grad()
        _loss(expected, len(BAGS)).backward()
        optimizer.step()
        calls.clear()
        _loss(got, len(BAGS)).backward()
        assert calls == {}  # held
    for bag, ref in zip(bags, reference, strict=True):
        torch.testing.assert_close(bag.read_weights(), ref.weight.detach(), atol=1e-5, rtol=0)
