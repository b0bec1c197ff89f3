"""Slot checksums of a migration: the one-pass row hash equals its definition.

The definition (fmix64 chained over a row's key, then every 8-byte word of its
value bytes followed by its state bytes, zero-padded to a whole word; summed
per slot mod 2**64) is written out here the slow way, so source and target
nodes of different versions keep agreeing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recstore.core import NUM_SLOTS, TableSpec, hash_keys, slot_of
from recstore.ps.reshard.slots import keys_in, row_hashes, slot_checksums
from recstore.store import Table


def _defined_row_hashes(keys: np.ndarray, values: np.ndarray, state: np.ndarray) -> np.ndarray:
    n = len(keys)
    raw = np.concatenate(
        [values.view(np.uint8).reshape(n, -1), state.view(np.uint8).reshape(n, -1)], axis=1
    )
    raw = np.pad(raw, ((0, 0), (0, (-raw.shape[1]) % 8)))
    words = np.ascontiguousarray(raw).view(np.uint64)
    h = hash_keys(keys)
    for column in range(words.shape[1]):
        h = hash_keys((h ^ words[:, column]).view(np.int64))
    return h


def _table(dtype: str, dim: int, optimizer: str) -> Table:
    spec = TableSpec.model_validate(
        {"name": "t", "num_embeddings": 3000, "embedding_dim": dim, "dtype": dtype,
         "optimizer": {"kind": optimizer}}
    )  # fmt: skip
    table = Table(spec)
    ids = torch.arange(3000)
    table.update(ids, torch.randn(3000, dim, generator=torch.Generator().manual_seed(1)))
    return table


@pytest.mark.parametrize(
    ("dtype", "dim", "optimizer"),
    [("float32", 16, "adam"), ("float16", 3, "adagrad"), ("bfloat16", 5, "sgd")],
)
def test_row_hashes_and_slot_sums_match_the_definition(
    dtype: str, dim: int, optimizer: str
) -> None:
    table = _table(dtype, dim, optimizer)
    slots = np.zeros(NUM_SLOTS, dtype=bool)
    slots[100:4200] = True
    chunk = table.export_keys(keys_in(table, slots))
    expected = _defined_row_hashes(chunk.keys, chunk.values, chunk.state)
    assert np.array_equal(row_hashes(chunk), expected)

    wanted, counts, sums = slot_checksums(table, slots)
    by_slot = np.zeros(NUM_SLOTS, dtype=np.uint64)
    np.add.at(by_slot, slot_of(chunk.keys), expected)
    assert np.array_equal(wanted, np.flatnonzero(slots))
    assert np.array_equal(counts, np.bincount(slot_of(chunk.keys), minlength=NUM_SLOTS)[wanted])
    assert np.array_equal(sums, by_slot[wanted])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_slots_without_rows_sum_to_zero(optimizer: str) -> None:
    table = _table("float32", 4, optimizer)
    table.erase(table.keys())
    slots = np.zeros(NUM_SLOTS, dtype=bool)
    slots[:10] = True
    wanted, counts, sums = slot_checksums(table, slots)
    assert list(wanted) == list(range(10))
    assert not counts.any() and not sums.any()


def test_one_changed_state_word_changes_only_its_slot() -> None:
    table = _table("float32", 8, "adam")
    slots = np.ones(NUM_SLOTS, dtype=bool)
    before = slot_checksums(table, slots)
    key = np.array([7], dtype=np.int64)
    chunk = table.export_keys(key)
    state = chunk.state.copy()
    state[0, -1] += 1.0
    table.import_chunk(key, chunk.values, state)
    after = slot_checksums(table, slots)
    changed = np.flatnonzero(before[2] != after[2])
    assert list(changed) == [int(slot_of(key)[0])]
    assert np.array_equal(before[1], after[1])
