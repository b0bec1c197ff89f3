"""Inference tables (``mode: inference``) in the store: no optimizer state, updates refused.

The bytes-per-row figure quoted in docs/store.md comes from
``test_an_inference_adagrad_table_holds_no_optimizer_state``.
"""

from __future__ import annotations

import numpy as np
import pytest

from recstore import _native
from recstore.core import InferenceTable, TableSpec
from recstore.store import Table
from recstore.store.options import native_options

ROWS, DIM = 4096, 64


def _spec(mode: str, kind: str = "adagrad", **fields: object) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "emb",
            "num_embeddings": ROWS,
            "embedding_dim": DIM,
            "optimizer": {"kind": kind, "lr": 0.1},
            "mode": mode,
            **fields,
        }
    )


def test_an_inference_adagrad_table_holds_no_optimizer_state() -> None:
    training, inference = Table(_spec("training")), Table(_spec("inference"))
    state_per_row = 4 * DIM  # adagrad: one fp32 accumulator per value
    assert training.memory_bytes / ROWS - inference.memory_bytes / ROWS == state_per_row
    # dense rows: the values (64 x fp32) and a one-byte residency flag
    assert inference.memory_bytes / ROWS == 4 * DIM + 1
    assert training.memory_bytes / ROWS == 4 * DIM + 1 + state_per_row
    assert _spec("inference").state_width == 0
    assert _spec("training").state_width == DIM


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_an_inference_table_refuses_updates_and_changes_nothing(kind: str) -> None:
    table = Table(_spec("inference", kind))
    keys = np.arange(10, dtype=np.int64)
    before = table.pull(keys).copy()
    with pytest.raises(
        InferenceTable, match="table 'emb' is an inference table: updates are refused"
    ):
        table.update(keys, np.ones((10, DIM), np.float32))
    np.testing.assert_array_equal(table.pull(keys), before)
    assert table.optimizer_state() == {"step": 0}


def test_the_engine_itself_refuses_updates_of_an_inference_table() -> None:
    """The PS node's native path drives the engine directly: it refuses as well."""
    engine = _native.Table(native_options(_spec("inference"), 0, 1, _native))
    keys = np.arange(4, dtype=np.int64)
    with pytest.raises(_native.InferenceTableError, match="inference table refuses updates"):
        engine.update(keys, np.ones((4, DIM), np.float32), 0.1)
    assert engine.stats()["step"] == 0


def test_an_inference_table_loads_weights_by_push_and_import() -> None:
    table = Table(_spec("inference"))
    keys = np.array([3, 7], dtype=np.int64)
    values = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
    table.push(keys, values)
    np.testing.assert_array_equal(table.pull(keys), values)
    table.import_chunk(np.array([9], np.int64), values[:1] + 1, np.empty((1, 0), np.float32))
    (chunk,) = table.export_chunks()
    assert chunk.state.shape == (3, 0)
    np.testing.assert_array_equal(chunk.values[chunk.keys == 9], values[:1] + 1)


def test_a_training_table_still_updates() -> None:
    table = Table(_spec("training"))
    keys = np.arange(4, dtype=np.int64)
    before = table.pull(keys).copy()
    table.update(keys, np.ones((4, DIM), np.float32))
    assert not np.array_equal(table.pull(keys), before)


@pytest.mark.gpu
@pytest.mark.skipif(not _native.cuda_available(), reason="needs a CUDA device")
def test_a_cuda_inference_table_holds_no_state_and_refuses_updates() -> None:
    training = Table(_spec("training"), device="cuda")
    inference = Table(_spec("inference"), device="cuda")
    assert training.memory_bytes - inference.memory_bytes == 4 * DIM * ROWS
    keys = np.arange(8, dtype=np.int64)
    before = inference.pull(keys).copy()
    with pytest.raises(InferenceTable, match="is an inference table: updates are refused"):
        inference.update(keys, np.ones((8, DIM), np.float32))
    np.testing.assert_array_equal(inference.pull(keys), before)
    inference.push(keys[:1], np.full((1, DIM), 3.0, np.float32))
    np.testing.assert_array_equal(inference.pull(keys[:1]), np.full((1, DIM), 3.0, np.float32))
