"""The CPU engine's one-pass slot passes equal their numpy definitions.

``Table.native_slot_checksums`` (csrc/table_slots.cc) must give exactly the
per-slot counts and hash sums of ``exported_slot_checksums`` (rows exported,
hashed by ``row_hashes``), ``Table.native_row_hashes`` the hash of each key's
row, and ``Table.keys_in_slots`` exactly the resident
keys whose slot is selected, on every dtype and optimizer, on both index
kinds (direct dense rows, the hash index), and after the writes a move makes:
updates, evictions, imports, erasures (cleanup) and expiry.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from recstore.core import NUM_SLOTS, TableSpec, slot_of
from recstore.ps.reshard.slots import exported_slot_checksums, row_hashes, slot_checksums
from recstore.store import Table

DTYPES = ["float32", "float16", "bfloat16"]
OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]


def _spec(dtype: str, dim: int, optimizer: str, keys: dict | None = None) -> TableSpec:
    body = {"name": "t", "num_embeddings": 4000, "embedding_dim": dim, "dtype": dtype,
            "optimizer": {"kind": optimizer}}  # fmt: skip
    if keys is not None:
        body["keys"] = keys
    return TableSpec.model_validate(body)


def _random_slots(rng: np.random.Generator) -> np.ndarray:
    slots = rng.random(NUM_SLOTS) < 0.4
    slots[rng.integers(0, NUM_SLOTS, 5)] = True
    return slots


def _assert_native_is_the_definition(table: Table, slots: np.ndarray) -> None:
    native = table.native_slot_checksums(slots)
    assert native is not None
    counts, sums = native
    assert not counts[~slots].any() and not sums[~slots].any()
    wanted, oracle_counts, oracle_sums = exported_slot_checksums(table, slots)
    assert np.array_equal(counts[wanted], oracle_counts)
    assert np.array_equal(sums[wanted], oracle_sums)
    got = slot_checksums(table, slots)
    assert all(
        np.array_equal(a, b) for a, b in zip(got, (wanted, oracle_counts, oracle_sums), strict=True)
    )

    every = table.keys()
    expected_keys = every[slots[slot_of(every)]]
    assert np.array_equal(table.keys_in_slots(slots), expected_keys)

    # one row at a time: the hash of each resident key's row, absent keys found False
    asked = np.arange(table.spec.num_embeddings, dtype=np.int64)[::-1].copy()
    got = table.native_row_hashes(asked)
    assert got is not None
    hashes, found = got
    chunk = table.export_keys(asked)  # the resident ones (not expired), in asked order
    assert np.array_equal(asked[found], chunk.keys)
    assert np.array_equal(hashes[found], row_hashes(chunk)) and not hashes[~found].any()
    outside = table.native_row_hashes(np.array([-3, 1 << 40], np.int64))  # never rows
    assert outside is not None and not outside[1].any()


# dims: value rows a whole number of words (split) and not (joined with the state)
@pytest.mark.parametrize(("dtype", "optimizer"), list(itertools.product(DTYPES, OPTIMIZERS)))
@pytest.mark.parametrize("dim", [1, 3, 8, 13])
@pytest.mark.parametrize("num_shards", [1, 2])  # direct rows, the hash index
def test_native_checksums_equal_the_numpy_definition(
    dtype: str, optimizer: str, dim: int, num_shards: int
) -> None:
    rng = np.random.default_rng(dim * 31 + num_shards)
    table = Table(_spec(dtype, dim, optimizer), num_shards=num_shards)
    every = torch.arange(4000)
    ids = every[slot_of(every.numpy()) % num_shards == 0]
    ids = ids[torch.from_numpy(rng.random(len(ids)) < 0.7)]
    table.update(ids, torch.from_numpy(rng.standard_normal((len(ids), dim)).astype(np.float32)))
    _assert_native_is_the_definition(table, _random_slots(rng))
    _assert_native_is_the_definition(table, np.ones(NUM_SLOTS, dtype=bool))
    _assert_native_is_the_definition(table, np.zeros(NUM_SLOTS, dtype=bool))


def test_native_passes_follow_updates_evictions_imports_and_erasures() -> None:
    rng = np.random.default_rng(5)
    spec = _spec("float16", 5, "adam", {"mode": "hashed", "capacity": 600, "eviction": "lru"})
    table = Table(spec)
    slots = _random_slots(rng)
    keys = rng.integers(-(2**62), 2**62, 2000)
    for start in range(0, 2000, 250):  # past capacity: later batches evict earlier rows
        batch = torch.from_numpy(keys[start : start + 250])
        table.update(batch, torch.randn(len(batch), 5))
        _assert_native_is_the_definition(table, slots)
    assert table.stats()["evictions"] > 0
    chunk = table.export_keys(table.keys()[:50])
    table.import_chunk(chunk.keys, chunk.values, chunk.state + 1.0)  # as a target imports
    _assert_native_is_the_definition(table, slots)
    table.erase(table.keys_in_slots(~slots))  # as a source's cleanup after the move
    assert not table.keys_in_slots(~slots).size
    _assert_native_is_the_definition(table, slots)


def test_expired_rows_are_left_out_as_an_export_leaves_them() -> None:
    now = [100.0]
    spec = _spec("float32", 4, "sgd", {"mode": "hashed", "capacity": 500, "ttl_seconds": 10})
    table = Table(spec, clock=lambda: now[0])
    table.update(torch.arange(200), torch.randn(200, 4))
    now[0] = 105.0
    table.update(torch.arange(100, 300), torch.randn(200, 4))
    now[0] = 112.0  # rows only the first update touched are expired, still resident
    slots = np.ones(NUM_SLOTS, dtype=bool)
    counts, _ = table.native_slot_checksums(slots) or (None, None)
    assert counts is not None and counts.sum() == 200
    _assert_native_is_the_definition(table, slots)


def test_native_passes_refuse_a_mask_of_the_wrong_length() -> None:
    table = Table(_spec("float32", 4, "sgd"))
    with pytest.raises(Exception, match="16384"):
        table.native_slot_checksums(np.ones(100, dtype=bool))
    with pytest.raises(Exception, match="16384"):
        table.keys_in_slots(np.ones(100, dtype=bool))
