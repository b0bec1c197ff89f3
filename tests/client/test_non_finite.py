"""NaN and infinite values through the SDK: the documented RuntimeError, nothing written.

``RecStoreClient.update`` / ``push`` raise ``BackendError`` (a RuntimeError) with
code INVALID_ARGUMENT and the store's reason on both backends; a NaN gradient in
a ``recstore.nn`` module's backward is an error of the backward (local) or of
the next call that waits for it (gRPC); ``metadata={"non_finite": ...}`` picks
another policy.
"""

from __future__ import annotations

import pytest
import torch

from recstore import nn as rnn
from recstore.client import BackendError

from .conftest import unique_name

NUM, DIM = 20, 4


def _table(client, **metadata) -> str:
    name = unique_name()
    ones = lambda shape, dtype: torch.ones(shape, dtype=dtype)  # noqa: E731
    client.init_data(name, (NUM, DIM), torch.float32, init_func=ones, metadata=metadata or None)
    return name


def test_update_and_push_refuse_a_batch_with_nan_and_write_nothing(any_client) -> None:
    name = _table(any_client, optimizer={"kind": "adagrad", "lr": 0.1})
    ids = torch.tensor([1, 2, 3])
    grads = torch.full((3, DIM), 0.5)
    grads[2, 1] = float("nan")
    before = any_client.pull(name, torch.arange(NUM))
    with pytest.raises(BackendError) as raised:
        any_client.update(name, ids, grads)
    assert isinstance(raised.value, RuntimeError)
    assert raised.value.code == "INVALID_ARGUMENT"
    assert f"table {name!r}" in raised.value.reason
    assert "1 of 3 gradient rows hold NaN or infinite values (the first: key 3" in str(raised.value)
    values = torch.ones(2, DIM)
    values[0, 0] = float("inf")
    with pytest.raises(BackendError, match="1 of 2 value rows hold NaN or infinite values"):
        any_client.push(name, torch.tensor([5, 6]), values)
    torch.testing.assert_close(any_client.pull(name, torch.arange(NUM)), before)


def test_skip_rows_from_metadata_applies_the_finite_rows(any_client) -> None:
    name = _table(any_client, non_finite="skip-rows")
    grads = torch.ones(3, DIM)
    grads[1, 0] = float("nan")
    any_client.update(name, torch.tensor([1, 2, 3]), grads, lr=0.5)
    rows = any_client.pull(name, torch.tensor([1, 2, 3]))
    torch.testing.assert_close(rows[[0, 2]], torch.full((2, DIM), 0.5))
    torch.testing.assert_close(rows[1], torch.ones(DIM))  # left as it was


def test_a_nan_gradient_in_backward_is_a_clear_error(any_client) -> None:
    name = unique_name()
    module = rnn.Embedding(NUM, DIM, client=any_client, name=name)
    before = module(torch.arange(NUM)).detach()
    out = module(torch.tensor([4, 7]))
    loss = (out * torch.tensor([[1.0], [float("nan")]])).sum()
    if any_client._backend().kind == "local":  # applied inside backward
        with pytest.raises(RuntimeError, match="gradient rows hold NaN or infinite values"):
            loss.backward()
    else:  # sent from backward; the next call that waits for it reports it
        loss.backward()
        with pytest.raises(RuntimeError, match="gradient rows hold NaN or infinite values"):
            any_client.flush()
    torch.testing.assert_close(module(torch.arange(NUM)).detach(), before)
