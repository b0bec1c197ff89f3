"""Optimizer numerics: the engine against torch.optim on the same rows (1e-6 relative).

Each step sends a batch with duplicate keys; the engine merges them, torch gets
the coalesced gradient. SGD, Adagrad and Adam (with weight decay) are compared
on a parameter made of exactly the touched rows, which then matches the sparse
update row for row; SparseAdam is compared on a whole table with a different
subset of rows each step (lazy moments); RowWiseAdagrad against the formula.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from recstore.core import TableSpec
from recstore.store import Table

RTOL, ATOL = 1e-6, 1e-7
DIM = 8
ROWS = np.array([3, 7, 11, 12, 40], dtype=np.int64)


def table(kind: str, **opt: Any) -> Table:
    spec = TableSpec(
        name="t",
        num_embeddings=64,
        embedding_dim=DIM,
        initializer={"kind": "uniform", "low": -1.0, "high": 1.0, "seed": 7},
        optimizer={"kind": kind, **opt},
    )
    return Table(spec)


def batches(steps: int, rows: np.ndarray = ROWS, seed: int = 0):
    """Batches hitting every row of ``rows`` with some duplicates, plus their merged grads."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        keys = np.concatenate([rows, rng.choice(rows, size=4)])
        rng.shuffle(keys)
        grads = rng.normal(0, 1, (len(keys), DIM)).astype(np.float32)
        merged = np.zeros((len(rows), DIM), np.float32)
        for k, g in zip(keys, grads, strict=True):
            merged[np.searchsorted(rows, k)] += g
        yield keys, grads, merged


@pytest.mark.parametrize(
    ("kind", "make_torch", "opt"),
    [
        ("sgd", lambda p, o: torch.optim.SGD([p], lr=o["lr"], weight_decay=o["weight_decay"]), {}),
        (
            "adagrad",
            lambda p, o: torch.optim.Adagrad(
                [p],
                lr=o["lr"],
                weight_decay=o["weight_decay"],
                eps=o["eps"],
                initial_accumulator_value=o["initial_accumulator_value"],
            ),
            {"initial_accumulator_value": 0.1},
        ),
        (
            "adam",
            lambda p, o: torch.optim.Adam(
                [p],
                lr=o["lr"],
                betas=(o["beta1"], o["beta2"]),
                eps=o["eps"],
                weight_decay=o["weight_decay"],
            ),
            # torch.optim.Adam adds eps after the bias correction, SparseAdam before it;
            # a tiny eps makes the two placements agree.
            {"beta1": 0.8, "beta2": 0.99, "eps": 1e-14},
        ),
    ],
)
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_matches_torch_optim_on_the_touched_rows(kind, make_torch, opt, weight_decay) -> None:
    o = {
        "lr": 0.05,
        "weight_decay": weight_decay,
        "eps": 1e-8,
        "beta1": 0.9,
        "beta2": 0.999,
        "initial_accumulator_value": 0.0,
        **opt,
    }
    t = table(kind, **o)
    param = torch.nn.Parameter(torch.from_numpy(t.pull(ROWS).copy()))
    reference = make_torch(param, o)
    for keys, grads, merged in batches(6):
        t.update(keys, grads)
        param.grad = torch.from_numpy(merged)
        reference.step()
        np.testing.assert_allclose(t.find(ROWS)[0], param.detach().numpy(), rtol=RTOL, atol=ATOL)
    state = {int(k): s for c in t.export_chunks() for k, s in zip(c.keys, c.state, strict=True)}
    got = np.stack([state[int(k)] for k in ROWS])
    torch_state = reference.state[param]
    if kind == "adagrad":
        np.testing.assert_allclose(got, torch_state["sum"].numpy(), rtol=RTOL)
    elif kind == "adam":
        # Adam writes the moment updates as lerp / mul+addcmul, SparseAdam (and the
        # engine) as old + (new - old) * (1 - beta): equal up to fp32 rounding.
        np.testing.assert_allclose(
            got[:, :DIM], torch_state["exp_avg"].numpy(), rtol=1e-5, atol=ATOL
        )
        np.testing.assert_allclose(got[:, DIM:], torch_state["exp_avg_sq"].numpy(), rtol=1e-5)


def test_adam_matches_sparse_adam_with_lazy_moments() -> None:
    t = table("adam", lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8)
    everything = np.arange(64, dtype=np.int64)
    param = torch.nn.Parameter(torch.from_numpy(t.pull(everything).copy()))
    reference = torch.optim.SparseAdam([param], lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    rng = np.random.default_rng(1)
    for step in range(8):
        keys = rng.choice(64, size=24).astype(np.int64)  # duplicates, rows left out
        grads = rng.normal(0, 1, (24, DIM)).astype(np.float32)
        t.update(keys, grads)
        param.grad = torch.sparse_coo_tensor(
            torch.from_numpy(keys)[None], torch.from_numpy(grads), (64, DIM), check_invariants=True
        )
        reference.step()
        assert t.optimizer_state() == {"step": step + 1}
        np.testing.assert_allclose(
            t.find(everything)[0], param.detach().numpy(), rtol=RTOL, atol=ATOL
        )


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_rowwise_adagrad_matches_the_written_out_rule(weight_decay) -> None:
    lr, eps, g0 = 0.1, 1e-8, 0.2
    t = table(
        "rowwise_adagrad", lr=lr, eps=eps, weight_decay=weight_decay, initial_accumulator_value=g0
    )
    w = torch.from_numpy(t.pull(ROWS).copy())
    accumulator = torch.full((len(ROWS),), g0)
    for keys, grads, merged in batches(6, seed=3):
        t.update(keys, grads)
        # G += mean(g^2 over the row); w -= lr * g / (sqrt(G) + eps), g including L2 decay.
        g = torch.from_numpy(merged) + weight_decay * w
        accumulator += (g * g).mean(dim=1)
        w = w - lr * g / (accumulator.sqrt() + eps)[:, None]
        np.testing.assert_allclose(t.find(ROWS)[0], w.numpy(), rtol=RTOL, atol=ATOL)
    state = {int(k): s for c in t.export_chunks() for k, s in zip(c.keys, c.state, strict=True)}
    np.testing.assert_allclose([state[int(k)][0] for k in ROWS], accumulator.numpy(), rtol=RTOL)


def test_lr_override_applies_to_one_call_only() -> None:
    a, b = table("sgd", lr=0.1), table("sgd", lr=0.1)
    keys, grads = np.array([1], np.int64), np.ones((1, DIM), np.float32)
    start = a.pull(keys).copy()
    b.pull(keys)
    a.update(keys, grads, lr=0.5)
    a.update(keys, grads)
    np.testing.assert_allclose(a.find(keys)[0], start - 0.6, rtol=RTOL)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_tables_update_in_fp32_and_round_once(dtype) -> None:
    spec = TableSpec(
        name="t",
        num_embeddings=4,
        embedding_dim=DIM,
        dtype=dtype,
        initializer={"kind": "zeros"},
        optimizer={"kind": "sgd", "lr": 1.0},
    )
    t = Table(spec)
    keys = torch.tensor([0, 0, 1])
    grads = torch.full((3, DIM), -0.1, dtype=torch.float32)
    t.update(keys, grads)
    got = t.find(torch.tensor([0, 1]))[0]
    assert got.dtype == getattr(torch, dtype)
    want = torch.tensor([[0.2] * DIM, [0.1] * DIM], dtype=torch.float32).to(getattr(torch, dtype))
    assert torch.equal(got, want)
    t.update(keys, grads.to(getattr(torch, dtype)))  # grads in the table dtype work too
    assert torch.allclose(
        t.find(torch.tensor([0]))[0].float(), torch.full((1, DIM), 0.4), rtol=1e-2
    )


@pytest.mark.parametrize("grad_dtype", [np.float16, np.uint16], ids=["float16", "bfloat16 bits"])
def test_a_float32_table_takes_16_bit_gradients_and_steps_in_float32(grad_dtype: Any) -> None:
    """What 16-bit transport sends: the optimizer still runs on the float32 rows."""
    keys = np.array([1, 4, 4, 9])
    grads = np.random.default_rng(5).standard_normal((4, DIM)).astype(np.float32)
    if grad_dtype is np.float16:
        narrow, widened = grads.astype(np.float16), grads.astype(np.float16).astype(np.float32)
    else:
        narrow = torch.from_numpy(grads).to(torch.bfloat16).view(torch.uint16).numpy()
        widened = torch.from_numpy(grads).to(torch.bfloat16).float().numpy()
    sixteen, exact = table("adagrad", lr=0.1), table("adagrad", lr=0.1)
    sixteen.update(keys, narrow)
    exact.update(keys, widened)
    np.testing.assert_array_equal(sixteen.pull(np.arange(12)), exact.pull(np.arange(12)))
