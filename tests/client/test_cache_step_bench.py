"""bench/cache_step_bench.py's fixed-popularity workload: the same rows stay hot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
SPEC = importlib.util.spec_from_file_location("cache_step_bench", BENCH / "cache_step_bench.py")
assert SPEC is not None and SPEC.loader is not None
step_bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(step_bench)


def _hottest(batch: tuple[list[torch.Tensor], torch.Tensor], table: int) -> set[int]:
    ids, counts = torch.unique(batch[0][table], return_counts=True)
    return set(ids[counts.argsort(descending=True)[:20]].tolist())


def test_fixed_popularity_keeps_the_hot_rows_across_batches() -> None:
    _, fixed = step_bench.workload_batches(step_bench.FIXED, 3)
    _, permuted = step_bench.workload_batches("zipf-rowwise-adagrad", 3)
    for data in (fixed, permuted):
        ids, target = data[0]
        assert len(ids) == step_bench.TABLES and ids[0].shape == (step_bench.BATCH, 10)
        assert target.shape == (step_bench.BATCH, step_bench.TABLES * step_bench.DIM)
        assert all(int(x.min()) >= 0 and int(x.max()) < step_bench.ROWS for x in ids)
    # the 20 hottest rows of a batch: the same ones batch after batch only when fixed
    assert len(_hottest(fixed[0], 0) & _hottest(fixed[2], 0)) >= 15
    assert len(_hottest(permuted[0], 0) & _hottest(permuted[2], 0)) <= 2
    assert _hottest(fixed[0], 0) != _hottest(fixed[0], 1)  # a permutation per table
