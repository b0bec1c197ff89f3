"""RecStoreClient.export_rows / import_rows on both backends (gRPC: two shards)."""

from __future__ import annotations

import pytest
import torch

from recstore.client import BackendError, RecStoreClient, RowChunk
from recstore.core import NUM_SLOTS, slot_of

from .conftest import unique_name

NUM, DIM = 200, 4


def _trained(client: RecStoreClient, optimizer: str = "adagrad") -> str:
    name = unique_name("rows")
    client.init_data(name, (NUM, DIM), torch.float32, init_func=_ones, optimizer=optimizer)
    ids = torch.arange(NUM)
    for step in range(3):
        grads = torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(step))
        client.update(name, ids, grads, lr=0.1)
    return name


def _ones(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype)


def _gathered(chunks: list[RowChunk]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    keys = torch.cat([c.keys for c in chunks])
    order = torch.argsort(keys)
    values = torch.cat([c.values for c in chunks])[order]
    states = [c.state for c in chunks]
    state = torch.cat(states)[order] if all(s is not None for s in states) else None  # type: ignore[misc]
    return keys[order], values, state


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_rows_and_state_round_trip_and_train_on_alike(any_client, optimizer) -> None:
    source = _trained(any_client, optimizer)
    target = unique_name("rows")
    any_client.init_data(target, (NUM, DIM), torch.float32, optimizer=optimizer)
    chunks = list(any_client.export_rows(source, with_state=True))
    assert any_client.import_rows(target, chunks) == NUM
    keys, values, state = _gathered(list(any_client.export_rows(target, with_state=True)))
    want_keys, want_values, want_state = _gathered(chunks)
    assert torch.equal(keys, torch.arange(NUM)) and torch.equal(keys, want_keys)
    assert torch.equal(values, want_values) and torch.equal(state, want_state)
    if optimizer == "adagrad":  # adam's step count is per table, not per row
        grads = torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(9))
        for name in (source, target):
            any_client.update(name, torch.arange(NUM), grads, lr=0.1)
        ids = torch.arange(NUM)
        assert torch.equal(any_client.pull(source, ids), any_client.pull(target, ids))


def test_without_state_chunks_carry_values_only(any_client) -> None:
    name = _trained(any_client)
    chunks = list(any_client.export_rows(name))
    assert all(c.state is None for c in chunks)
    keys, values, _ = _gathered(chunks)
    assert torch.equal(values, any_client.pull(name, keys))


def test_a_slot_mask_selects_rows(any_client) -> None:
    name = _trained(any_client)
    slots = torch.from_numpy(slot_of(torch.arange(NUM).numpy()))
    mask = torch.zeros(NUM_SLOTS, dtype=torch.bool)
    mask[slots[:50]] = True
    keys, _, _ = _gathered(list(any_client.export_rows(name, slots=mask)))
    assert torch.equal(keys, torch.arange(NUM)[mask[slots]])


def test_a_bad_mask_and_a_bad_chunk_are_refused(any_client) -> None:
    name = _trained(any_client)
    with pytest.raises(ValueError, match="one entry per slot"):
        any_client.export_rows(name, slots=torch.ones(10, dtype=torch.bool))
    before = any_client.pull(name, torch.arange(NUM))
    bad = RowChunk(torch.arange(3), torch.zeros(3, DIM), torch.zeros(3, 5))
    with pytest.raises(BackendError):
        any_client.import_rows(name, [bad])
    assert torch.equal(any_client.pull(name, torch.arange(NUM)), before)
