"""Translate a TableSpec (plus the shard it is) into native engine options.

Kept apart from the Table class so the sizing rules (how many rows a shard
holds, when dense ids need a hash index) are plain functions tests can pin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from recstore.core import DType, Eviction, KeyMode, NonFinite, TableSpec
from recstore.core.shard_rows import rows_for_share
from recstore.core.spec import DEFAULT_GPU_CACHE_FRACTION

DTYPE_CODES = {DType.float32: 0, DType.float16: 1, DType.bfloat16: 2}
OPTIMIZER_CODES = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 2, "adam": 3}
INITIALIZER_CODES = {"zeros": 0, "normal": 1, "uniform": 2}
EVICTION_CODES = {Eviction.none: 0, Eviction.lru: 1, Eviction.lfu: 2}
#: csrc/non_finite.h, enum NonFinitePolicy
NON_FINITE_CODES = {NonFinite.reject: 0, NonFinite.skip_rows: 1, NonFinite.allow: 2}


@dataclass(frozen=True)
class Layout:
    """How one shard addresses its rows."""

    direct: bool  # row == id
    id_limit: int  # > 0: ids must lie in [0, id_limit)
    capacity: int  # rows the shard holds


def shard_layout(spec: TableSpec, shard_index: int, num_shards: int) -> Layout:
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} is not in [0, num_shards={num_shards})")
    if spec.key_mode == KeyMode.dense:
        n = spec.num_embeddings
        if num_shards == 1:
            return Layout(direct=True, id_limit=n, capacity=n)
        return Layout(direct=False, id_limit=n, capacity=rows_for_share(spec, 1, num_shards))
    return Layout(direct=False, id_limit=0, capacity=rows_for_share(spec, 1, num_shards))


def non_finite_code(spec: TableSpec) -> int:
    """The engine's code of the spec's non-finite policy."""
    return NON_FINITE_CODES[NonFinite(spec.non_finite)]


def native_options(
    spec: TableSpec, shard_index: int, num_shards: int, native: Any, min_rows: int = 0
) -> Any:
    """A ``_native.TableOptions`` for this shard of ``spec``; a hashed shard holds at
    least ``min_rows`` rows (a capacity it grew to while serving), never more than its ids."""
    layout = shard_layout(spec, shard_index, num_shards)
    opts = native.TableOptions()
    opts.dim = spec.embedding_dim
    opts.dtype = DTYPE_CODES[DType(spec.dtype)]
    opts.direct = layout.direct
    opts.id_limit = layout.id_limit
    opts.capacity = layout.capacity
    if not layout.direct and min_rows > layout.capacity:
        opts.capacity = min(min_rows, layout.id_limit) if layout.id_limit else min_rows
    keys = spec.keys
    opts.eviction = EVICTION_CODES[Eviction(keys.eviction)]
    opts.ttl_seconds = float(keys.ttl_seconds or 0.0)
    opts.non_finite = non_finite_code(spec)
    opts.inference = spec.inference
    init = spec.initializer
    opts.init.kind = INITIALIZER_CODES[init.kind]
    opts.init.mean = init.mean
    opts.init.std = init.std
    opts.init.low = init.low
    opts.init.high = init.high
    opts.init.seed = init.seed
    o = spec.optimizer
    opts.opt.kind = OPTIMIZER_CODES[o.kind]
    opts.opt.lr = o.lr
    opts.opt.weight_decay = o.weight_decay
    opts.opt.eps = o.eps
    opts.opt.initial_accumulator_value = o.initial_accumulator_value
    opts.opt.beta1 = o.beta1
    opts.opt.beta2 = o.beta2
    return opts


def cache_size(spec: TableSpec, shard_index: int, num_shards: int) -> tuple[int, int]:
    """(rows, bytes) one shard of a ``storage: gpu_cache`` table asks its cache for
    (one of them 0; the engine turns bytes into rows of the table).

    ``rows`` and ``bytes`` size the whole table's cache and are split evenly over
    the shards; without either, each shard caches 10% of the rows it holds.
    """
    cache = spec.cache
    if cache.rows is not None:
        return max(1, math.ceil(cache.rows / num_shards)), 0
    if cache.bytes is not None:
        return 0, cache.bytes // num_shards
    held = shard_layout(spec, shard_index, num_shards).capacity
    return max(1, math.ceil(DEFAULT_GPU_CACHE_FRACTION * held)), 0


def native_cache_options(spec: TableSpec, shard_index: int, num_shards: int, native: Any) -> Any:
    """A ``_native.CacheOptions`` for this shard of a ``storage: gpu_cache`` table."""
    opts = native.CacheOptions()
    opts.rows, opts.bytes = cache_size(spec, shard_index, num_shards)
    opts.ways = spec.cache.ways
    opts.policy = native.CACHE_LRU
    return opts
