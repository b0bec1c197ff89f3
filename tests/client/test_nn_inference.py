"""Inference tables through the SDK: ``metadata={"mode": "inference"}`` and
``recstore.nn`` modules built with ``optimize_for_training=False``.

Such a module reads exactly what torch.nn reads, with or without grad enabled;
its outputs never require grad, and an update of its table is the documented
RuntimeError (BackendError) naming the table, on both backends.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recstore import nn as rnn
from recstore.client import BackendError

from .conftest import unique_name

NUM, DIM = 30, 4
WEIGHTS = torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(3))


def _refusal(name: str) -> str:
    return f"table {name!r} is an inference table: updates are refused"


def test_init_data_opens_an_inference_table_that_refuses_updates(any_client) -> None:
    name = unique_name()
    any_client.init_data(
        name, (NUM, DIM), torch.float32, init_func=lambda shape, dtype: WEIGHTS.clone(),
        metadata={"mode": "inference", "optimizer": {"kind": "adagrad", "lr": 0.1}},
    )  # fmt: skip
    with pytest.raises(BackendError) as raised:
        any_client.update(name, torch.tensor([1, 2]), torch.ones(2, DIM))
    assert isinstance(raised.value, RuntimeError)
    assert raised.value.code == "FAILED_PRECONDITION"
    assert _refusal(name) in str(raised.value)
    torch.testing.assert_close(any_client.pull(name, torch.arange(NUM)), WEIGHTS)
    any_client.push(name, torch.tensor([0]), torch.zeros(1, DIM))  # loading weights is allowed
    torch.testing.assert_close(any_client.pull(name, torch.tensor([0])), torch.zeros(1, DIM))


@pytest.mark.parametrize("grad", [False, True])
def test_an_inference_embedding_matches_torch_and_takes_no_gradients(any_client, grad) -> None:
    module = rnn.Embedding.from_pretrained(
        WEIGHTS, client=any_client, name=unique_name(), optimize_for_training=False
    )
    ids = torch.tensor([[1, 5, 5], [29, 0, 7]])
    with torch.set_grad_enabled(grad):
        out = module(ids)
    torch.testing.assert_close(out, F.embedding(ids, WEIGHTS))
    assert not out.requires_grad
    with pytest.raises(BackendError, match=_refusal(module.table_name)):
        any_client.update(module.table_name, torch.tensor([1]), torch.ones(1, DIM))
    torch.testing.assert_close(module.weight, WEIGHTS)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_an_inference_bag_matches_torch(any_client, mode) -> None:
    module = rnn.EmbeddingBag.from_pretrained(
        WEIGHTS, mode=mode, client=any_client, name=unique_name(), optimize_for_training=False
    )
    ids, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 2, 5])
    out = module(ids, offsets)
    torch.testing.assert_close(out, F.embedding_bag(ids, WEIGHTS, offsets, mode=mode))
    assert not out.requires_grad
    assert module.optimize_for_training is False


def test_a_training_embedding_still_trains(local_client) -> None:
    module = rnn.Embedding(NUM, DIM, client=local_client, name=unique_name())
    ids = torch.tensor([1, 2])
    before = module.read_weights(ids)
    module(ids).sum().backward()
    assert not torch.equal(module.read_weights(ids), before)


def test_a_collection_config_opens_an_inference_bag(any_client) -> None:
    """Backward through a collection updates its training bags only, and no error."""
    served = rnn.EmbeddingBagConfig(
        NUM, DIM, name=unique_name(), mode="sum", seed=1, optimize_for_training=False
    )
    trained = rnn.EmbeddingBagConfig(
        NUM, DIM, name=unique_name(), mode="sum", seed=2, optimizer={"kind": "sgd", "lr": 0.1}
    )
    collection = rnn.EmbeddingBagCollection([served, trained], client=any_client)
    bag, other = collection.bags
    assert bag.optimize_for_training is False and not bag.takes_gradients
    ids = torch.tensor([[1, 2]])
    before = bag.read_weights(), other.read_weights(ids[0])
    outputs = collection([ids, ids])
    assert not outputs[0].requires_grad and outputs[1].requires_grad
    torch.testing.assert_close(outputs[0], before[0][[1, 2]].sum(0, keepdim=True))
    (outputs[0] + outputs[1]).sum().backward()
    torch.testing.assert_close(bag.read_weights(), before[0])
    torch.testing.assert_close(other.read_weights(ids[0]), before[1] - 0.1)
    with pytest.raises(BackendError, match=_refusal(served.name)):
        any_client.update(served.name, torch.tensor([1]), torch.ones(1, DIM))
