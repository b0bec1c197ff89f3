"""The host cache's policy constants, row bits and byte accounting.

Remote lookups cross the wire for every id; a cache in front keeps the hot rows
of a skewed (Zipf-like) id stream next to the model. Layers read through
``native_host_cache.NativeHostCache`` (the engine runs the policy) and the GPU
tier (``nve.device_cache``) runs the same policy in torch; this module holds
what both share: the policy names and constants (defined by the engine,
``csrc/host_row_cache.h``), the rows' bits and what one cached row costs.

Layout: set-associative, as NVIDIA's embedding cache is: a key hashes to one
set of ``WAYS`` slots; its row lives in one preallocated tensor. Policies:

- ``"lfu"`` (the default): TinyLFU. A count-min sketch estimates every key's
  recent frequency (counters halve every ``AGE_EVERY`` x capacity accesses, so
  old popularity fades); a missed key is admitted only when it is estimated
  more frequent than the slot's victim (the set's least frequent key), so a
  one-off id never pushes out a hot row.
- ``"lru"``: the set's least recently used slot goes; every missed key enters.

``bench/cache_bench.py`` measures both against Belady's MIN on the same traces
(docs/sdk.md quotes the table); LFU with admission wins at every size measured,
by most at the small sizes where one-off ids would otherwise flush hot rows.
The policy stated in numpy, slot by slot, is the tests' oracle
(``tests/client/host_cache_model.py``).

Bytes: rows, keys, a stamp per slot and the sketch together stay within
``capacity_bytes`` (``bytes_per_row``). Rows are held and handed out as numpy
arrays of the table dtype's bits (``to_bits``): numpy's gathers run on the
calling thread, where torch's would wait for its thread pool on a busy machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from recstore import _native as _native_module

_native: Any = _native_module

POLICIES = ("lfu", "lru")
# the policy's constants live in the engine (host_row_cache.h), which runs it for lookups
WAYS: int = _native.HOST_CACHE_WAYS
SKETCH_DEPTH: int = _native.HOST_CACHE_SKETCH_DEPTH
#: sketch counters per row of each depth: wide enough that one-off ids rarely share a
#: counter with a hot one (at 1x, collisions let one-offs look hot on small caches)
SKETCH_WIDTH: int = _native.HOST_CACHE_SKETCH_WIDTH
SKETCH_MAX: int = _native.HOST_CACHE_SKETCH_MAX  # uint8 counters saturate here
#: the sketch's counters halve after this many accesses per cached row
AGE_EVERY: int = _native.HOST_CACHE_AGE_EVERY
_SET_HASH = np.uint64(_native.HOST_CACHE_SET_HASH)
_SKETCH_HASHES = np.array(_native.HOST_CACHE_SKETCH_HASHES, dtype=np.uint64)


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """A dtype numpy has, of the same size: 16-bit floats travel as int16 bits."""
    return dtype if dtype == torch.float32 else torch.int16


def to_bits(rows: torch.Tensor) -> np.ndarray:
    """``rows`` (CPU) as a numpy array of their bits (no copy when contiguous)."""
    return rows.contiguous().view(_bits_dtype(rows.dtype)).numpy()


def from_bits(bits: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(bits).view(dtype)


def bytes_per_row(row_bytes: int) -> int:
    """What one cached row costs: its values, its key (8), its use stamp (8), the step
    it was read at (8), its share of the sketch (uint8 counters)."""
    return row_bytes + 8 + 8 + 8 + SKETCH_DEPTH * SKETCH_WIDTH


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    insertions: int = 0
    rejected: int = 0  # missed keys the admission rule kept out
    invalidations: int = 0  # times every row was dropped (a newer table version)

    @property
    def hit_rate(self) -> float:
        looked = self.hits + self.misses
        return self.hits / looked if looked else 0.0
