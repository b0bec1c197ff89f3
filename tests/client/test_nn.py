"""recstore.nn modules train exactly like torch.nn modules + torch.optim, on both backends."""

from __future__ import annotations

import pytest
import torch

from recstore import nn as rnn

from .conftest import unique_name

NUM, DIM, STEPS = 60, 6, 5
OPTIMIZERS = {
    "sgd": (lambda params: torch.optim.SGD(params, lr=0.1), {"kind": "sgd", "lr": 0.1}),
    "adagrad": (lambda params: torch.optim.Adagrad(params, lr=0.1), {"kind": "adagrad", "lr": 0.1}),
}


def _initial_weights() -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(7))


def _batches(step: int, bag: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    if not bag:
        return {"input": torch.randint(0, NUM, (4, 5), generator=g)}
    ids = torch.randint(0, NUM, (17,), generator=g)
    ids[3] = ids[4]  # a duplicate inside a bag
    return {
        "input": ids,
        "offsets": torch.tensor([0, 3, 3, 9, 12]),  # one empty bag
        "per_sample_weights": torch.rand(17, generator=g),
    }


def _train(module, optimizer, bag: bool, mode: str | None) -> list[torch.Tensor]:
    outputs = []
    for step in range(STEPS):
        batch = _batches(step, bag)
        if mode != "sum":
            batch.pop("per_sample_weights", None)
        out = module(**batch)
        target = torch.linspace(-1, 1, out.numel()).view_as(out)
        loss = ((out - target) ** 2).sum()
        if optimizer is not None:
            optimizer.zero_grad()
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        outputs.append(out.detach())
    return outputs


CASES = [
    ("embedding", None, {}),
    ("embedding", None, {"padding_idx": 3}),
    ("embedding", None, {"scale_grad_by_freq": True}),
    ("bag", "sum", {}),
    ("bag", "mean", {"padding_idx": 5}),
    ("bag", "max", {}),
    ("bag", "mean", {"include_last_offset": True}),
]


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize(("kind", "mode", "options"), CASES)
def test_training_matches_torch(any_client, kind, mode, options, optimizer_name) -> None:
    make_torch_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    weights = _initial_weights()
    bag = kind == "bag"
    extra = {"mode": mode} if bag else {}
    reference = (torch.nn.EmbeddingBag if bag else torch.nn.Embedding)(
        NUM, DIM, _weight=weights.clone(), **extra, **options
    )
    module = (rnn.EmbeddingBag if bag else rnn.Embedding)(
        NUM, DIM, _weight=weights.clone(), **extra, **options,
        name=unique_name("nn"), client=any_client, optimizer=server_optimizer,
    )  # fmt: skip
    assert list(module.parameters()) == []  # a dense optimizer never sees the table
    expected = _train(reference, make_torch_optimizer(reference.parameters()), bag, mode)
    got = _train(module, None, bag, mode)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"output of step {step}")
    torch.testing.assert_close(module.read_weights(), reference.weight.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("uniform_offsets", [False, True])
def test_bags_of_one_size_train_as_torchs(any_client, mode, uniform_offsets, optimizer_name):
    """Bags of one size (a [bags, size] input, or offsets 0, s, 2s...): remotely pooled
    from each distinct id's row and their gradients summed per distinct id."""
    make_torch_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    weights = _initial_weights()
    reference = torch.nn.EmbeddingBag(NUM, DIM, mode=mode, _weight=weights.clone())
    module = rnn.EmbeddingBag(NUM, DIM, mode=mode, _weight=weights.clone(), name=unique_name(),
                              client=any_client, optimizer=server_optimizer)  # fmt: skip
    torch_optimizer = make_torch_optimizer(reference.parameters())
    for step in range(STEPS):
        g = torch.Generator().manual_seed(2000 + step)
        ids = torch.randint(0, NUM, (6, 4), generator=g)
        ids[2] = ids[1]  # the same ids in two bags
        ids[0, 1] = ids[0, 0]  # and twice in one
        batch = {"input": ids}
        if uniform_offsets:
            batch = {"input": ids.reshape(-1), "offsets": torch.arange(0, 24, 4)}
        outputs = [m(**batch) for m in (module, reference)]
        for out in outputs:
            ((out - torch.linspace(-1, 1, out.numel()).view_as(out)) ** 2).sum().backward()
        torch_optimizer.step()
        torch_optimizer.zero_grad()
        torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(module.read_weights(), reference.weight.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("bags_of_one_size", [True, False])
def test_a_gradient_broadcast_over_the_bags_trains_as_torchs(any_client, bags_of_one_size):
    """A loss over the bags' sum hands backward one row expanded over every bag (rows 0
    apart): the engine must read it as that row for each bag, not refuse or misread it."""
    weights = _initial_weights()
    reference = torch.nn.EmbeddingBag(NUM, DIM, mode="sum", _weight=weights.clone())
    module = rnn.EmbeddingBag(NUM, DIM, mode="sum", _weight=weights.clone(), name=unique_name(),
                              client=any_client, optimizer={"kind": "sgd", "lr": 0.1})  # fmt: skip
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    scale = torch.linspace(-1, 1, DIM)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(3000 + step)
        ids = torch.randint(0, NUM, (6, 4), generator=g)
        batch = {"input": ids}
        if not bags_of_one_size:
            batch = {"input": ids.reshape(-1)[:-1], "offsets": torch.tensor([0, 3, 9, 12, 20])}
        for m in (module, reference):
            (m(**batch).sum(0) * scale).sum().backward()  # d/d(out) = scale on every bag
        torch_optimizer.step()
        torch_optimizer.zero_grad()
    torch.testing.assert_close(module.read_weights(), reference.weight.detach(), atol=1e-5, rtol=0)


def test_default_initialisation_is_torchs(local_client) -> None:
    module = rnn.Embedding(2000, 8, padding_idx=0, client=local_client, seed=3)
    weights = module.weight
    assert torch.count_nonzero(weights[0]) == 0
    assert abs(weights[1:].mean().item()) < 0.05 and 0.95 < weights[1:].std().item() < 1.05
    assert torch.equal(module.read_weights(torch.tensor([5])), weights[[5]])


def test_frozen_and_no_grad_lookups_do_not_update(any_client) -> None:
    weights = _initial_weights()
    frozen = rnn.Embedding.from_pretrained(weights.clone(), client=any_client, name=unique_name())
    assert not frozen(torch.tensor([[1, 2]])).requires_grad
    torch.testing.assert_close(frozen.weight, weights)
    trainable = rnn.EmbeddingBag(
        NUM, DIM, _weight=weights.clone(), client=any_client, name=unique_name()
    )
    with torch.no_grad():
        out = trainable(torch.tensor([[1, 2]]))
    assert not out.requires_grad
    torch.testing.assert_close(trainable.weight, weights)


def test_max_norm_renormalises_rows_like_torch(any_client) -> None:
    weights = _initial_weights() * 3
    reference = torch.nn.Embedding(NUM, DIM, max_norm=1.0, _weight=weights.clone())
    module = rnn.Embedding(
        NUM, DIM, max_norm=1.0, _weight=weights.clone(), client=any_client, name=unique_name(),
        optimizer={"kind": "sgd", "lr": 0.1},
    )  # fmt: skip
    expected = _train(reference, torch.optim.SGD(reference.parameters(), lr=0.1), False, None)
    got = _train(module, None, False, None)
    torch.testing.assert_close(got[-1], expected[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(module.weight, reference.weight.detach(), atol=1e-5, rtol=0)


def test_mixed_model_dense_optimizer_and_server_side_optimizer(local_client) -> None:
    """A trainer's dense optimizer updates the MLP; the table updates itself in backward."""
    torch.manual_seed(0)
    weights = _initial_weights()
    bag = rnn.EmbeddingBag(NUM, DIM, mode="sum", _weight=weights.clone(), client=local_client,
                           name=unique_name(), optimizer={"kind": "sgd", "lr": 0.05})  # fmt: skip
    ref_bag = torch.nn.EmbeddingBag(NUM, DIM, mode="sum", _weight=weights.clone())
    head, ref_head = torch.nn.Linear(DIM, 1), torch.nn.Linear(DIM, 1)
    ref_head.load_state_dict(head.state_dict())
    opt = torch.optim.SGD(head.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD([*ref_bag.parameters(), *ref_head.parameters()], lr=0.05)
    for step in range(STEPS):
        ids = torch.randint(0, NUM, (8, 3), generator=torch.Generator().manual_seed(step))
        for model, optimizer in (((bag, head), opt), ((ref_bag, ref_head), ref_opt)):
            optimizer.zero_grad()
            model[1](model[0](ids)).pow(2).mean().backward()
            optimizer.step()
    torch.testing.assert_close(head.weight, ref_head.weight, atol=1e-5, rtol=0)
    torch.testing.assert_close(bag.weight, ref_bag.weight.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"mode": "median"}, ValueError), ({"padding_idx": NUM}, ValueError)],
)
def test_bad_module_arguments(local_client, kwargs, error) -> None:
    with pytest.raises(error):
        rnn.EmbeddingBag(NUM, DIM, client=local_client, name=unique_name(), **kwargs)


def test_out_of_range_ids_are_refused_and_change_nothing(local_client) -> None:
    weights = _initial_weights()
    module = rnn.Embedding(
        NUM, DIM, _weight=weights.clone(), client=local_client, name=unique_name()
    )
    with pytest.raises(ValueError, match="out of range"):
        module(torch.tensor([1, NUM]))
    torch.testing.assert_close(module.weight, weights)
