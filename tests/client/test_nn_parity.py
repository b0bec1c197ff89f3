"""recstore.nn against torch.nn over the whole option matrix, forward and after K steps.

Every combination of mode, input layout (2-D, even offsets, uneven offsets
with an empty bag), include_last_offset, padding_idx, per_sample_weights,
max_norm and id dtype (int32/int64) trains a RecStore bag with its
server-side optimizer next to a torch.nn.EmbeddingBag with torch.optim and
the same hyper-parameters, on both backends: outputs of every step and the
final rows must agree. Small tables and few steps keep the matrix fast.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
import torch

from recstore import nn as rnn

from .conftest import unique_name

NUM, DIM, STEPS, PAD, MAX_NORM = 24, 4, 2, 5, 1.5
OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), {"kind": "sgd", "lr": 0.1}),
    "adagrad": (lambda p: torch.optim.Adagrad(p, lr=0.1), {"kind": "adagrad", "lr": 0.1}),
}
#: (mode, per_sample_weights): weights exist for mode="sum" only, as in torch
MODES = [("sum", False), ("sum", True), ("mean", False), ("max", False)]
#: (layout, include_last_offset)
LAYOUTS = [("2d", False), ("even", False), ("even", True), ("uneven", False), ("uneven", True)]


def _weights() -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(3)) * 0.8


def _batch(step: int, layout: str, last: bool, weighted: bool, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    if layout == "2d":
        ids = torch.randint(0, NUM, (4, 3), generator=g)
        offsets = None
    elif layout == "even":
        ids = torch.randint(0, NUM, (12,), generator=g)
        offsets = torch.arange(0, 12 + (3 if last else 0), 3)
    else:
        ids = torch.randint(0, NUM, (11,), generator=g)
        offsets = torch.tensor([0, 2, 2, 7] + ([11] if last else []))  # an empty bag
    flat = ids.view(-1)
    flat[1] = flat[0]  # a repeat inside a bag
    if step % 2 == 1:
        flat[-1] = PAD  # the padding id in some batches, not in others
    else:
        flat[flat == PAD] = PAD + 1
    batch = {"input": ids.to(dtype)}
    if offsets is not None:
        batch["offsets"] = offsets.to(dtype)
    if weighted:
        batch["per_sample_weights"] = torch.rand(ids.shape, generator=g)
    return batch


def _train_side_by_side(
    reference: torch.nn.Module,
    module: torch.nn.Module,
    make_optimizer: Callable[[Iterator[torch.nn.Parameter]], torch.optim.Optimizer],
    inputs: Callable[[int], dict],
) -> None:
    """STEPS steps of the torch module (torch.optim) and its RecStore twin (server-side
    optimizer) towards the same target on ``inputs(step)``: the outputs agree at every
    step and the rows at the end."""
    torch_optimizer = make_optimizer(reference.parameters())
    for step in range(STEPS):
        batch = inputs(step)
        expected, out = reference(**batch), module(**batch)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0, msg=f"step {step}")
        target = torch.linspace(-1, 1, out.numel()).view_as(out)
        torch_optimizer.zero_grad()
        ((expected - target) ** 2).sum().backward()
        torch_optimizer.step()
        ((out - target) ** 2).sum().backward()
    torch.testing.assert_close(module.weight, reference.weight.detach(), atol=1e-5, rtol=0)


def _with_optimizers(*axes: list) -> list[tuple]:
    """The full product of ``axes``, each combination with one optimizer: by the parity of
    its value indices, so each optimizer meets every pair of values of any two axes (the
    whole product twice over is too slow for the suite)."""
    names = sorted(OPTIMIZERS)
    return [
        (*(axis[i] for axis, i in zip(axes, index, strict=True)), names[sum(index) % 2])
        for index in itertools.product(*(range(len(axis)) for axis in axes))
    ]


CASES = [
    (*mode, *layout, padding, max_norm, dtype, optimizer)
    for mode, layout, padding, max_norm, dtype, optimizer in _with_optimizers(
        MODES, LAYOUTS, [None, PAD], [None, MAX_NORM], [torch.int64, torch.int32]
    )
]


def _id(case: tuple) -> str:
    mode, weighted, layout, last, padding, max_norm, dtype, optimizer_name = case
    return "-".join(
        [mode + ("+psw" if weighted else ""), layout + ("+last" if last else ""),
         "pad" if padding is not None else "nopad", "maxnorm" if max_norm else "nonorm",
         str(dtype).removeprefix("torch."), optimizer_name]
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_bags_match_torch(any_client, case) -> None:
    mode, weighted, layout, last, padding, max_norm, dtype, optimizer_name = case
    make_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    options = {"mode": mode, "include_last_offset": last, "padding_idx": padding,
               "max_norm": max_norm}  # fmt: skip
    weights = _weights()
    reference = torch.nn.EmbeddingBag(
        NUM, DIM, _weight=weights.clone(), sparse=mode != "max", **options
    )
    module = rnn.EmbeddingBag(
        NUM, DIM, _weight=weights.clone(), name=unique_name("parity"), client=any_client,
        optimizer=server_optimizer, **options,
    )  # fmt: skip
    _train_side_by_side(
        reference, module, make_optimizer, lambda step: _batch(step, layout, last, weighted, dtype)
    )


EMBEDDING_CASES = _with_optimizers(
    [None, PAD], [None, MAX_NORM], [False, True], [torch.int64, torch.int32], ["1d", "2d"]
)


@pytest.mark.parametrize(
    ("padding", "max_norm", "by_freq", "dtype", "shape", "optimizer_name"), EMBEDDING_CASES
)
def test_embeddings_match_torch(
    any_client, padding, max_norm, by_freq, dtype, shape, optimizer_name
) -> None:
    make_optimizer, server_optimizer = OPTIMIZERS[optimizer_name]
    options = {"padding_idx": padding, "max_norm": max_norm, "scale_grad_by_freq": by_freq}
    weights = _weights()
    reference = torch.nn.Embedding(NUM, DIM, _weight=weights.clone(), sparse=not by_freq, **options)
    module = rnn.Embedding(
        NUM, DIM, _weight=weights.clone(), name=unique_name("parity"), client=any_client,
        optimizer=server_optimizer, **options,
    )  # fmt: skip

    def inputs(step: int) -> dict:
        ids = _batch(step, "2d", False, False, dtype)["input"]
        return {"input": ids.view(-1) if shape == "1d" else ids}

    _train_side_by_side(reference, module, make_optimizer, inputs)
