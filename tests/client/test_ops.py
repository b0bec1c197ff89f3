"""torch.ops.recstore: registered on import, callable directly, shapes right under fake tensors."""

from __future__ import annotations

import pytest
import torch

from recstore import nn as rnn

from .conftest import unique_name

REFERENCE_OPS = [
    "emb_read", "emb_write", "emb_update_table", "init_embedding_table", "emb_prefetch",
    "emb_wait_result", "local_lookup_flat", "local_update_flat",
]  # fmt: skip
MODULE_OPS = [
    "emb_lookup", "emb_lookup_many", "emb_renorm", "emb_update_many", "emb_pool_many",
    "emb_update_pooled_many",
]  # fmt: skip


def test_the_reference_ops_and_the_modules_ops_are_registered() -> None:
    for name in REFERENCE_OPS + MODULE_OPS:
        assert isinstance(getattr(torch.ops.recstore, name).default, torch._ops.OpOverload), name


def test_kv_ops_read_write_update_and_prefetch(any_client) -> None:
    name = unique_name("op")
    torch.ops.recstore.init_embedding_table(any_client.role, name, 10, 3)
    table = f"{any_client.role}/{name}"
    ops = torch.ops.recstore
    ops.emb_write(table, torch.tensor([1, 4]), torch.ones(2, 3))
    torch.testing.assert_close(ops.emb_read(table, torch.tensor([4, 1])), torch.ones(2, 3))
    lr = any_client.learning_rate
    ops.emb_update_table(table, torch.tensor([4, 4, 1]), torch.ones(3, 3))  # repeats are summed
    expected = torch.tensor([[1 - 2 * lr] * 3, [1 - lr] * 3])
    torch.testing.assert_close(ops.emb_read(table, torch.tensor([4, 1])), expected)
    prefetch_id = ops.emb_prefetch(table, torch.tensor([1]))
    torch.testing.assert_close(ops.emb_wait_result(table, prefetch_id), expected[1:])
    with pytest.raises(ValueError, match="out of range"):
        ops.emb_read(table, torch.tensor([10]))


def test_local_fast_path_ops_need_the_local_backend(local_client, grpc_client) -> None:
    ops = torch.ops.recstore
    for client in (local_client, grpc_client):
        name = unique_name("flat")
        torch.ops.recstore.init_embedding_table(client.role, name, 8, 2)
        table = f"{client.role}/{name}"
        ops.emb_write(table, torch.tensor([3]), torch.full((1, 2), 2.0))
        if client is local_client:
            torch.testing.assert_close(ops.local_lookup_flat(table, torch.tensor([3])),
                                       torch.full((1, 2), 2.0))  # fmt: skip
            ops.local_update_flat(table, torch.tensor([3]), torch.ones(1, 2))
            torch.testing.assert_close(ops.emb_read(table, torch.tensor([3])),
                                       torch.full((1, 2), 2.0 - client.learning_rate))  # fmt: skip
        else:
            with pytest.raises(RuntimeError, match="need the local backend"):
                ops.local_lookup_flat(table, torch.tensor([3]))


def test_an_unknown_handle_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="no RecStore table is registered under 'nobody/none'"):
        torch.ops.recstore.emb_read("nobody/none", torch.tensor([0]))


def test_lookup_ops_pass_torch_opcheck(local_client) -> None:
    """Schema, fake kernel and autograd registration agree with the real op (the lookups'
    backward updates the table, so only the pure reads are also run twice through AOT)."""
    bag = rnn.EmbeddingBag(20, 3, client=local_client, name=unique_name("chk"))
    other = rnn.EmbeddingBag(20, 5, client=local_client, name=unique_name("chk"))
    ids, more = torch.tensor([1, 5, 5, 7]), torch.tensor([[2, 3], [3, 9]])
    ops = torch.ops.recstore
    once = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(
        ops.emb_lookup, (bag._anchor, bag._handle, ids, None, False), test_utils=once
    )
    torch.library.opcheck(
        ops.emb_lookup_many,
        (bag._anchor, [bag._handle, other._handle], [ids, more], [-1, 2], [False, True],
         [True, True]),
        test_utils=once,
    )  # fmt: skip
    torch.library.opcheck(ops.emb_read, (bag._handle, ids))
    torch.library.opcheck(ops.local_lookup_flat, (bag._handle, ids))
