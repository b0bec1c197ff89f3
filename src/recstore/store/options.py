"""Translate a TableSpec (plus the shard it is) into native engine options.

Kept apart from the Table class; the sizing rules (how many rows a shard holds,
when dense ids need a hash index, its GPU cache) are ``recstore.core.shard_rows``'s,
plain functions tests pin and a pool's capacity check shares.
"""

from __future__ import annotations

from typing import Any

from recstore.core import DType, Eviction, NonFinite, TableSpec
from recstore.core.shard_rows import cache_size, shard_layout

DTYPE_CODES = {DType.float32: 0, DType.float16: 1, DType.bfloat16: 2}
OPTIMIZER_CODES = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 2, "adam": 3}
INITIALIZER_CODES = {"zeros": 0, "normal": 1, "uniform": 2}
EVICTION_CODES = {Eviction.none: 0, Eviction.lru: 1, Eviction.lfu: 2}
#: csrc/non_finite.h, enum NonFinitePolicy
NON_FINITE_CODES = {NonFinite.reject: 0, NonFinite.skip_rows: 1, NonFinite.allow: 2}


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


def native_cache_options(spec: TableSpec, shard_index: int, num_shards: int, native: Any) -> Any:
    """A ``_native.CacheOptions`` for this shard of a ``storage: gpu_cache`` table."""
    opts = native.CacheOptions()
    opts.rows, opts.bytes = cache_size(spec, shard_index, num_shards)
    opts.ways = spec.cache.ways
    opts.policy = native.CACHE_LRU
    return opts
