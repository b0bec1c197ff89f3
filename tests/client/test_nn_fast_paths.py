"""The plain lookups' short road (gather, fixed-size bags) trains exactly like torch.nn."""

from __future__ import annotations

import pytest
import torch

from recstore import nn as rnn

from .conftest import unique_name

NUM, DIM, BAGS, BAG_SIZE, STEPS = 80, 5, 6, 3, 4
OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), {"kind": "sgd", "lr": 0.1}),
    "adagrad": (lambda p: torch.optim.Adagrad(p, lr=0.1), {"kind": "adagrad", "lr": 0.1}),
}


def _batch(step: int, layout: str, weighted: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(500 + step)
    ids = torch.randint(0, NUM, (BAGS, BAG_SIZE), generator=g)
    ids[0, 1] = ids[0, 0]  # a repeat inside a bag
    ids[2, 0] = ids[0, 0]  # and across bags
    batch = {"input": ids}
    if layout == "offsets":
        batch = {"input": ids.reshape(-1), "offsets": torch.arange(0, BAGS * BAG_SIZE, BAG_SIZE)}
    if weighted:
        batch["per_sample_weights"] = torch.rand(batch["input"].shape, generator=g)
    return batch


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize(
    ("layout", "mode", "weighted"),
    [("2d", "sum", False), ("2d", "mean", False), ("offsets", "sum", True),
     ("offsets", "mean", False)],
)  # fmt: skip
def test_fixed_size_bags_match_torch(any_client, layout, mode, weighted, optimizer_name) -> None:
    make_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    weights = torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(9))
    reference = torch.nn.EmbeddingBag(NUM, DIM, mode=mode, _weight=weights.clone())
    module = rnn.EmbeddingBag(
        NUM, DIM, mode=mode, _weight=weights.clone(), name=unique_name("fast"),
        client=any_client, optimizer=server_optimizer,
    )  # fmt: skip
    torch_optimizer = make_optimizer(reference.parameters())
    for step in range(STEPS):
        batch = _batch(step, layout, weighted)
        assert (
            module._fixed_bag_size(
                batch["input"], batch.get("offsets"), batch.get("per_sample_weights")
            )
            == BAG_SIZE
        )  # the short road is the one under test
        expected, out = reference(**batch), module(**batch)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
        target = torch.linspace(-1, 1, out.numel()).view_as(out)
        torch_optimizer.zero_grad()
        ((expected - target) ** 2).sum().backward()
        torch_optimizer.step()
        ((out - target) ** 2).sum().backward()
    any_client.flush()
    torch.testing.assert_close(module.weight, reference.weight.detach(), atol=1e-5, rtol=0)


def test_per_sample_weights_get_gradients_on_the_short_road(any_client) -> None:
    weights = torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(2))
    reference = torch.nn.EmbeddingBag(NUM, DIM, mode="sum", _weight=weights.clone())
    module = rnn.EmbeddingBag(NUM, DIM, mode="sum", _weight=weights.clone(),
                              name=unique_name("psw"), client=any_client)  # fmt: skip
    batch = _batch(0, "offsets", weighted=True)
    expected_psw = batch["per_sample_weights"].clone().requires_grad_()
    psw = batch["per_sample_weights"].clone().requires_grad_()
    reference(batch["input"], batch["offsets"], expected_psw).sum().backward()
    module(batch["input"], batch["offsets"], psw).sum().backward()
    torch.testing.assert_close(psw.grad, expected_psw.grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("input", "offsets", "options"),
    [
        (torch.arange(6), torch.tensor([0, 2, 3]), {}),  # uneven bags
        (torch.arange(6), torch.tensor([0, 3]), {"padding_idx": 1}),  # padding row
        (torch.arange(6), torch.tensor([0, 2, 4, 6]), {"include_last_offset": True}),
        (torch.arange(6).view(2, 3), None, {"mode": "max"}),
        (torch.arange(6), torch.tensor([0, 3], dtype=torch.int32), {}),  # mixed id dtypes
        (torch.arange(0), torch.tensor([0]), {}),  # no lookups
    ],
)
def test_other_batches_take_torchs_road(local_client, input, offsets, options) -> None:
    module = rnn.EmbeddingBag(NUM, DIM, name=unique_name("gen"), client=local_client, **options)
    assert module._fixed_bag_size(input, offsets, None) == 0


def test_plain_embedding_gathers_like_torch(any_client) -> None:
    weights = torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(5))
    reference = torch.nn.Embedding(NUM, DIM, _weight=weights.clone())
    module = rnn.Embedding(NUM, DIM, _weight=weights.clone(), name=unique_name("emb"),
                           client=any_client, optimizer={"kind": "sgd", "lr": 0.1})  # fmt: skip
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    ids = torch.tensor([[3, 3, 7], [0, 79, 3]], dtype=torch.int32)
    for _ in range(3):
        expected, out = reference(ids), module(ids)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
        torch_optimizer.zero_grad()
        (expected**2).sum().backward()
        torch_optimizer.step()
        (out**2).sum().backward()
    torch.testing.assert_close(module.weight, reference.weight.detach(), atol=1e-5, rtol=0)


def test_out_of_range_ids_are_refused_before_anything_is_sent(any_client) -> None:
    module = rnn.EmbeddingBag(NUM, DIM, mode="sum", name=unique_name("bad"), client=any_client)
    before = module.weight
    with pytest.raises(ValueError, match="out of range"):
        module(torch.tensor([[1, NUM]]))
    torch.testing.assert_close(module.weight, before)
