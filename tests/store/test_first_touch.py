"""First touch of a big table: the pages under new rows are faulted in over the cores, once."""

from __future__ import annotations

import threading
from types import ModuleType

import numpy as np
import pytest

from recstore.core import TableSpec
from recstore.store import Table

PAGE = 2 << 20  # csrc/memory.h, PageFaulter::kPageBytes


def _spec(rows: int, dim: int = 64, **fields: object) -> TableSpec:
    return TableSpec(
        name="t", num_embeddings=rows, embedding_dim=dim,
        initializer={"kind": "normal", "std": 0.1, "seed": 3}, **fields,
    )  # fmt: skip


def _pages_bytes(rows: np.ndarray, row_bytes: int, arena: int) -> int:
    """Bytes of the distinct arena pages under ``rows`` (a short last page counts what it holds)."""
    pages = set()
    for row in rows.tolist():
        pages.update(range(row * row_bytes // PAGE, ((row + 1) * row_bytes - 1) // PAGE + 1))
    return sum(min(PAGE, arena - page * PAGE) for page in pages)


def test_a_first_pull_faults_in_the_pages_under_its_new_rows_once() -> None:
    rows = 200_000  # 51.2 MB of float32 rows: 25 pages, the last one short
    table = Table(_spec(rows))
    assert table.stats()["prefaulted_bytes"] == 0  # created at once: nothing touched yet
    keys = np.array([0, 1, 100_000, 199_999, 100_001])
    first = table.pull(keys)
    arena = rows * 64 * 4
    assert table.stats()["prefaulted_bytes"] == _pages_bytes(keys, 256, arena)
    again = table.pull(keys[::-1].copy())  # resident now: nothing more to fault in
    assert table.stats()["prefaulted_bytes"] == _pages_bytes(keys, 256, arena)
    np.testing.assert_array_equal(again[::-1], first)
    # the rows are the initializer's, as a table that creates them one at a time has them
    reference = Table(_spec(rows))
    for key, row in zip(keys.tolist(), first, strict=True):
        np.testing.assert_array_equal(reference.pull(np.array([key]))[0], row)


def test_the_optimizer_state_arena_is_faulted_in_with_the_rows() -> None:
    table = Table(_spec(100_000, optimizer={"kind": "adagrad"}))
    keys = np.array([5, 70_000])
    table.update(keys, np.ones((2, 64), np.float32))
    values = _pages_bytes(keys, 256, 100_000 * 256)
    assert table.stats()["prefaulted_bytes"] == 2 * values  # values and state: 64 fp32 each


def test_a_small_table_is_left_to_ordinary_faults() -> None:
    table = Table(_spec(1000))  # 256 kB: below one page
    table.pull(np.arange(1000))
    assert table.stats()["prefaulted_bytes"] == 0


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_concurrent_first_pulls_read_the_initialised_rows(dtype: str) -> None:
    rows, workers = 300_000, 4
    table, reference = Table(_spec(rows, dtype=dtype)), Table(_spec(rows, dtype=dtype))
    batches = [np.random.default_rng(i).integers(0, rows, 20_000) for i in range(workers)]
    expected = [reference.pull(keys) for keys in batches]
    start = threading.Barrier(workers)
    got: list[np.ndarray | None] = [None] * workers

    def pull(i: int) -> None:
        start.wait()  # every worker's first pull at once, over the same fresh arena
        got[i] = table.pull(batches[i])

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(workers):
        np.testing.assert_array_equal(got[i], expected[i])
    assert 0 < table.stats()["prefaulted_bytes"] <= rows * 64 * (4 if dtype == "float32" else 2)


@pytest.mark.parametrize("kind", ["normal", "uniform"])
def test_rows_a_first_pull_creates_are_the_initializers_to_the_bit(
    kind: str, oracle: ModuleType
) -> None:
    """A first pull creates whole rows at once (each Box-Muller pair computed once): every
    element is still the oracle's, odd widths included."""
    spec = TableSpec(
        name="t", num_embeddings=4_000_000, embedding_dim=33,
        initializer={"kind": kind, "seed": 11, "mean": 0.25, "std": 1.5, "low": -2, "high": 3},
    )  # fmt: skip
    keys = np.random.default_rng(5).choice(4_000_000, 2000, replace=False)
    got = Table(spec).pull(keys)
    want = np.stack([oracle.initial_row(spec, int(k)) for k in keys])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("dim", "mean", "std"), [(129, 0.0, 1.0), (64, 1000.0, 7.0), (130, -3.0, 1e-4)]
)
def test_a_first_pulls_normal_rows_are_the_oracles_for_every_pass_and_rounding(
    dim: int, mean: float, std: float, oracle: ModuleType
) -> None:
    """Rows are made 64 Box-Muller pairs per pass (polynomial log/sin/cos, libm where the
    fp32 rounding is too close to call); widths across passes and means that dwarf the
    spread (where that rounding is often close) still give the oracle's every bit."""
    spec = TableSpec(
        name="t", num_embeddings=1_000_000, embedding_dim=dim,
        initializer={"kind": "normal", "seed": 23, "mean": mean, "std": std},
    )  # fmt: skip
    keys = np.random.default_rng(dim).choice(1_000_000, 600, replace=False)
    got = Table(spec).pull(keys)
    want = np.stack([oracle.initial_row(spec, int(k)) for k in keys])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
