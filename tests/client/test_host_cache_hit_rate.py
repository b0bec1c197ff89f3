"""The host cache's hit rate on an independent Zipf stream against Belady's MIN: the
sketch's memory (``AGE_EVERY``) must be long enough for the counts of ids near the
cache's boundary to tell them apart (docs/sdk.md, "Policy")."""

from __future__ import annotations

import numpy as np
import torch

from recstore import _native
from recstore.client.host_cache import bytes_per_row
from recstore.client.native_host_cache import NativeHostCache

ROWS, CACHE_ROWS, BATCH, IDS = 100_000, 1_000, 256, 2_000_000


def _zipf_trace(alpha: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, ROWS + 1, dtype=np.float64) ** -alpha)
    ranks = np.searchsorted(cdf / cdf[-1], rng.random(IDS), side="right")
    return rng.permutation(ROWS)[np.minimum(ranks, ROWS - 1)].astype(np.int64)


def test_a_small_cache_warms_to_within_reach_of_min() -> None:
    trace = _zipf_trace(1.05, seed=5)
    cache = NativeHostCache(CACHE_ROWS * bytes_per_row(4), 1, torch.float32)
    assert cache.capacity_rows == CACHE_ROWS
    out = cache.empty_rows(BATCH)
    sequence, hits = [], []
    for start in range(0, IDS, BATCH):
        ids = trace[start : start + BATCH]
        _, first = np.unique(ids, return_index=True)
        keys = ids[np.sort(first)]  # a lookup's distinct ids, as a layer offers them
        missed = cache.lookup_into(keys, out[: len(keys)])
        hit = np.ones(len(keys), dtype=np.bool_)
        hit[missed] = False
        cache.insert(keys[missed], out[: len(missed)])
        sequence.append(keys)
        hits.append(hit)
    warm = sum(len(k) for k in sequence[: len(sequence) // 2])  # the last half is scored
    lfu = np.concatenate(hits)[warm:].mean()
    best = np.asarray(_native.belady_hit_mask(np.concatenate(sequence), CACHE_ROWS))
    ratio = lfu / best.view(np.bool_)[warm:].mean()
    # 0.842 with counters halved every 10 x capacity accesses, 0.866 with every 40 x
    assert ratio >= 0.855, ratio
