"""Freezing, copying and pickling recstore.nn modules as a torch.nn user would.

A module's rows live in its table, not in a Parameter, so torch's own
``requires_grad_`` (which walks parameters) and pickling (which would reach the
client's connections) need the modules' help; these tests hold them to what
torch.nn does or to a clear error.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from recstore import nn as rnn

from .conftest import unique_name

NUM, DIM = 20, 4
IDS = torch.tensor([[1, 2, 2], [5, 1, 7]])


def _weights() -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(5))


def _pair(client, kind: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A RecStore module and its torch.nn twin from the same rows, trained by SGD lr 0.1."""
    sgd = {"kind": "sgd", "lr": 0.1}
    if kind == "embedding":
        embedding = rnn.Embedding(NUM, DIM, _weight=_weights(), client=client,
                                  name=unique_name("freeze"), optimizer=sgd)  # fmt: skip
        return embedding, torch.nn.Embedding(NUM, DIM, _weight=_weights())
    ours = rnn.EmbeddingBag(NUM, DIM, mode="sum", _weight=_weights(), client=client,
                            name=unique_name("freeze"), optimizer=sgd)  # fmt: skip
    return ours, torch.nn.EmbeddingBag(NUM, DIM, mode="sum", _weight=_weights())


def _step(module: torch.nn.Module, scale: torch.Tensor) -> None:
    """One backward of a loss that also reaches a trainable tensor (so it always runs)."""
    (module(IDS) * scale).sum().backward()


@pytest.mark.parametrize("kind", ["embedding", "bag"])
def test_requires_grad_false_freezes_the_table_like_torch(any_client, kind) -> None:
    ours, reference = _pair(any_client, kind)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    scale = torch.full((DIM,), 0.5, requires_grad=True)
    assert ours.requires_grad_(False) is ours
    reference.requires_grad_(False)
    assert ours.frozen and not ours(IDS).requires_grad
    _step(ours, scale)
    _step(reference, scale)
    optimizer.step()
    torch.testing.assert_close(ours.weight, _weights())
    torch.testing.assert_close(reference.weight.detach(), _weights())

    ours.requires_grad_()  # trains again, exactly as torch does
    reference.requires_grad_()
    assert not ours.frozen and ours(IDS).requires_grad
    _step(ours, scale)
    _step(reference, scale)
    optimizer.step()
    assert not torch.equal(ours.weight, _weights())
    torch.testing.assert_close(ours.weight, reference.weight.detach())


def test_setting_frozen_freezes_and_unfreezes(local_client) -> None:
    module = rnn.Embedding.from_pretrained(_weights(), client=local_client, name=unique_name())
    assert module.frozen and not module(IDS).requires_grad
    module.frozen = False
    assert module(IDS).requires_grad
    module.frozen = True
    _step(module, torch.ones(DIM, requires_grad=True))
    torch.testing.assert_close(module.weight, _weights())


def test_a_collection_freezes_every_bag(any_client) -> None:
    bags = [_pair(any_client, "bag")[0] for _ in range(2)]
    collection = rnn.EmbeddingBagCollection(bags)
    scale = torch.full((DIM,), 0.5, requires_grad=True)

    def step() -> None:
        outputs = collection([IDS, IDS])
        torch.stack([(out * scale).sum() for out in outputs]).sum().backward()
        any_client.flush()

    collection.requires_grad_(False)
    assert all(bag.frozen for bag in bags)
    assert not any(out.requires_grad for out in collection([IDS, IDS]))
    step()
    for bag in bags:
        torch.testing.assert_close(bag.weight, _weights())
    collection.requires_grad_(True)
    step()
    assert all(not torch.equal(bag.weight, _weights()) for bag in bags)


def test_an_inference_module_refuses_gradients_and_nothing_changes(local_client) -> None:
    trainable = _pair(local_client, "bag")[0]
    inference = rnn.EmbeddingBag(NUM, DIM, mode="sum", _weight=_weights(), client=local_client,
                                 name=unique_name(), optimize_for_training=False)  # fmt: skip
    with pytest.raises(ValueError, match="inference table"):
        inference.requires_grad_(True)
    inference.requires_grad_(False)  # already takes none: allowed
    trainable.requires_grad_(False)
    collection = rnn.EmbeddingBagCollection([trainable, inference])
    with pytest.raises(ValueError, match="inference table"):
        collection.requires_grad_(True)
    assert trainable.frozen  # all or none: the refusal left the first bag frozen


def test_deep_copies_and_pickles_are_refused_clearly(local_client) -> None:
    module, _ = _pair(local_client, "bag")
    model = torch.nn.Sequential(rnn.EmbeddingBagCollection([module]))
    with pytest.raises(TypeError, match="deep copy"):
        copy.deepcopy(module)
    with pytest.raises(TypeError, match="deep copy"):
        copy.deepcopy(model)
    with pytest.raises(TypeError, match="state_dict"):
        pickle.dumps(module)
    with pytest.raises(TypeError, match="state_dict"):
        torch.save(model, io.BytesIO())
    shallow = copy.copy(module)  # a shallow copy shares the table, as it shares torch's weight
    assert shallow.table_name == module.table_name
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)  # the way the errors point to
    buffer.seek(0)
    torch.testing.assert_close(torch.load(buffer)["0.bags.0.weight"], _weights())
