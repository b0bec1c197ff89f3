"""Eager lookups skip the dispatcher; traced ones go through ``torch.ops.recstore``."""

from __future__ import annotations

import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile

from recstore import nn as rnn

from .conftest import unique_name

NUM, DIM = 20, 4


def _recstore_ops(step) -> list[str]:
    """The ``recstore::`` ops the dispatcher ran during ``step()`` (the profiler
    records every op call that goes through it)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sorted({e.key for e in prof.key_averages() if e.key.startswith("recstore::")})


def _modules(client):
    def make(cls, **options):
        return cls(NUM, DIM, client=client, name=unique_name("d"), **options)

    grid, ids, ragged = torch.randint(0, NUM, (4, 3)), torch.randint(0, NUM, (9,)), None
    ragged = torch.tensor([0, 4, 4])
    return [
        (make(rnn.Embedding, padding_idx=1, scale_grad_by_freq=True), (grid,)),
        (make(rnn.Embedding, max_norm=1.0), (grid,)),
        (make(rnn.EmbeddingBag, mode="sum"), (grid,)),
        (make(rnn.EmbeddingBag, mode="max"), (ids, ragged)),
        (rnn.EmbeddingBagCollection([make(rnn.EmbeddingBag), make(rnn.EmbeddingBag)]),
         ([grid, (ids, ragged)],)),
    ]  # fmt: skip


def _train_step(module, args) -> None:
    out = module(*args)
    loss = sum(o.sum() for o in out) if isinstance(out, list) else out.sum()
    loss.backward()


def test_eager_forward_and_backward_do_not_dispatch_custom_ops(local_client) -> None:
    for module, args in _modules(local_client):
        before = module.bags[0].weight if hasattr(module, "bags") else module.weight
        assert _recstore_ops(lambda m=module, a=args: _train_step(m, a)) == [], module
        after = module.bags[0].weight if hasattr(module, "bags") else module.weight
        assert not torch.equal(before, after), module  # the backward did update the table


def test_compiled_forward_and_backward_dispatch_custom_ops(local_client) -> None:
    torch._dynamo.reset()
    module, args = _modules(local_client)[0]  # plain bags: tests/client/test_compile_pooled.py
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    _train_step(compiled, args)  # compiles
    ran = _recstore_ops(lambda: _train_step(compiled, args))
    assert "recstore::emb_lookup" in ran and "recstore::emb_update_table" in ran


def test_fake_tensors_take_the_ops_shape_only_kernels(local_client) -> None:
    module = rnn.EmbeddingBag(NUM, DIM, mode="sum", client=local_client, name=unique_name("f"))
    stored = module.weight
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:  # the anchor stays real
        out = module(mode.from_tensor(torch.randint(0, NUM, (5, 3))))
    assert out.shape == (5, DIM)
    torch.testing.assert_close(module.weight, stored)


def _python_files_run_by(call) -> set[str]:
    """The source files of every Python function that runs during ``call()``."""
    files: set[str] = set()

    def record(frame, event, arg) -> None:
        if event == "call":
            files.add(frame.f_code.co_filename.replace("\\", "/"))

    sys.setprofile(record)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files


def test_a_traced_graphs_op_call_runs_the_kernel_without_custom_op_wrappers(local_client) -> None:
    """What a compiled graph runs per op: the dispatcher and the kernel; none of
    ``torch.library.custom_op``'s per-call layers (a dynamo-disable context, an
    output-aliasing check: 30-50 µs a call, in every compiled step), nor torch's
    autograd kernel sending a call that needs no gradient back through the dispatcher."""
    bag = rnn.EmbeddingBag(NUM, DIM, mode="sum", client=local_client, name=unique_name("w"))
    ids = torch.randint(0, NUM, (6,))
    stored = bag.weight

    def pool_and_update() -> None:
        with torch.no_grad():  # as inside a compiled forward or backward
            (out,) = torch.ops.recstore.emb_pool_many(
                bag._anchor, [bag._handle], [ids], [None], [3], [False], [True]
            )
            torch.ops.recstore.emb_update_pooled_many(
                [bag._handle], [ids], [None], [torch.ones_like(out)], [3], [False]
            )

    files = _python_files_run_by(pool_and_update)
    layers = ("torch/_library/custom_ops.py", "torch/_compile.py", "torch/_library/autograd.py")
    assert not any(f.endswith(layers) for f in files)
    assert any(f.endswith("/pooled.py") for f in files)  # the kernels did run
    assert not torch.equal(bag.weight, stored)
