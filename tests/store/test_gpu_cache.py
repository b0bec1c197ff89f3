"""The gpu_cache tier's CPU twin (``_native.CacheTable``), checked on every machine.

The twin is the oracle of the CUDA tier (test_gpu_cache_cuda.py); here it is
held to two references of its own: a pure-Python model of the cache directory
(tests/store/cache_model.py) for which keys are cached where and for the
counters, and a plain host table driven with the same calls for the rows and
the optimizer state (host memory is authoritative, the cache written through).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from recstore import _native
from recstore.core import DeviceUnavailable, TableSpec
from recstore.core.reconcile import parse_declaration, ps_node_args
from recstore.core.shard_rows import cache_size
from recstore.store import Table
from recstore.store.buffers import NUMPY_DTYPES
from recstore.store.options import native_cache_options, native_options

from .cache_model import CacheModel

OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]


def spec_of(**fields: Any) -> TableSpec:
    base: dict[str, Any] = {
        "name": "t",
        "num_embeddings": 400,
        "embedding_dim": 8,
        "storage": "gpu_cache",
        "initializer": {"kind": "uniform", "seed": 3},
    }
    base.update(fields)
    return TableSpec.model_validate(base)


def twin_and_host(spec: TableSpec) -> tuple[Any, Any]:
    options = native_options(spec, 0, 1, _native)
    cache = native_cache_options(spec, 0, 1, _native)
    return _native.CacheTable(options, cache), _native.Table(options)


def keys_of(rng: np.random.Generator, n: int, hot: int, universe: int) -> np.ndarray:
    """Ids with duplicates and a hot set, so hits, misses and evictions all happen."""
    hot_ids = rng.integers(0, hot, n)
    cold_ids = rng.integers(0, universe, n)
    return np.where(rng.random(n) < 0.7, hot_ids, cold_ids).astype(np.int64)


def rows(spec: TableSpec, n: int) -> np.ndarray:
    return np.empty((n, spec.embedding_dim), dtype=NUMPY_DTYPES[spec.dtype])


def assert_same_tables(spec: TableSpec, a: Any, b: Any) -> None:
    keys = np.sort(np.asarray(b.keys()))
    assert np.array_equal(np.sort(np.asarray(a.keys())), keys)
    out = []
    for t in (a, b):
        k_out = np.empty(len(keys), dtype=np.int64)
        values = rows(spec, len(keys))
        state = np.empty((len(keys), spec.state_width), dtype=np.float32)
        assert t.export_rows(keys, k_out, values, state) == len(keys)
        out.append((k_out, values, state))
    for x, y in zip(out[0], out[1], strict=True):
        assert np.array_equal(x, y)
    assert a.step == b.step


def assert_coherent(spec: TableSpec, twin: Any) -> None:
    """Every cached copy equals its host row."""
    keys, ticks = twin.directory()
    live = np.nonzero(ticks)[0]
    cached = twin.cached_rows().view(NUMPY_DTYPES[spec.dtype]).reshape(-1, spec.embedding_dim)
    host = rows(spec, len(live))
    found = np.zeros(len(live), dtype=np.bool_)
    twin.find(keys[live].copy(), host, found)
    assert found.all()
    assert np.array_equal(cached[live], host)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mixed_steps_leave_the_table_as_a_plain_host_table(optimizer: str, dtype: str) -> None:
    spec = spec_of(
        dtype=dtype,
        optimizer={"kind": optimizer, "lr": 0.05, "weight_decay": 0.01},
        gpu_cache={"rows": 40, "ways": 4},
    )
    twin, host = twin_and_host(spec)
    rng = np.random.default_rng(7)
    for step in range(40):
        ids = keys_of(rng, 64, 30, spec.num_embeddings)
        got, want = rows(spec, len(ids)), rows(spec, len(ids))
        twin.pull(ids, got)
        host.pull(ids, want)
        assert np.array_equal(got, want), f"step {step}: pulled rows differ"
        grads = rng.standard_normal((len(ids), spec.embedding_dim)).astype(np.float32)
        twin.update(ids, grads, 0.05)
        host.update(ids, grads, 0.05)
        if step % 7 == 3:
            few = ids[:5].copy()
            values = rng.standard_normal((5, spec.embedding_dim)).astype(np.float32)
            pushed = (
                values.astype(NUMPY_DTYPES[spec.dtype])
                if dtype == "float32"
                else ((values.view(np.uint32) >> 16).astype(np.uint16))
            )
            twin.assign(few, pushed)
            host.assign(few, pushed)
        if step % 11 == 5:
            gone = ids[5:9].copy()
            assert twin.erase(gone) == host.erase(gone)
        if step % 13 == 6:  # a checkpoint load of rows the cache holds
            few = np.unique(ids[:6])
            k_out, values = np.empty(len(few), np.int64), rows(spec, len(few))
            state = np.empty((len(few), spec.state_width), np.float32)
            got_rows = host.export_rows(few, k_out, values, state)
            values, state = values[:got_rows][::-1].copy(), state[:got_rows][::-1].copy()
            twin.import_rows(k_out[:got_rows].copy(), values, state)
            host.import_rows(k_out[:got_rows].copy(), values, state)
        assert_coherent(spec, twin)
    assert_same_tables(spec, twin, host)
    stats = twin.cache_stats()
    assert stats["cache_hits"] > 0 and stats["cache_evictions"] > 0


@pytest.mark.parametrize(("sets_rows", "ways"), [(24, 4), (8, 8), (5, 1)])
def test_directory_and_counters_follow_the_cache_model(sets_rows: int, ways: int) -> None:
    spec = spec_of(
        keys={"mode": "hashed", "capacity": 1000}, gpu_cache={"rows": sets_rows, "ways": ways}
    )
    twin, _ = twin_and_host(spec)
    model = CacheModel(twin.cache_sets, twin.cache_ways)
    rng = np.random.default_rng(11)
    for step in range(60):
        ids = keys_of(rng, 20, 12, 60) - 30  # negative keys too
        out = rows(spec, len(ids))
        twin.pull(ids, out)
        model.lookup(ids)
        if step % 9 == 4:
            twin.erase(ids[:3].copy())
            model.erase(ids[:3])
        keys, ticks = twin.directory()
        assert ticks.tolist() == model.ticks, f"step {step}"
        live = ticks != 0
        live_keys = [k for k, t in zip(model.keys, model.ticks, strict=True) if t]
        assert keys[live].tolist() == live_keys
    stats = twin.cache_stats()
    assert stats["cache_hits"] == model.hits
    assert stats["cache_misses"] == model.misses
    assert stats["cache_evictions"] == model.evictions
    assert stats["cache_resident_rows"] == len(model.resident())
    assert stats["cache_capacity_rows"] == twin.cache_sets * twin.cache_ways
    assert stats["cache_hit_rate"] == pytest.approx(model.hits / (model.hits + model.misses))
    assert stats["cache_resident_bytes"] == len(model.resident()) * spec.row_bytes


def test_a_set_full_of_this_calls_keys_bypasses_the_rest() -> None:
    spec = spec_of(keys={"mode": "hashed", "capacity": 100}, gpu_cache={"rows": 2, "ways": 2})
    twin, host = twin_and_host(spec)
    assert (twin.cache_sets, twin.cache_ways) == (1, 2)
    ids = np.array([5, 1, 9, 1], dtype=np.int64)
    got, want = rows(spec, 4), rows(spec, 4)
    twin.pull(ids, got)
    host.pull(ids, want)
    assert np.array_equal(got, want)
    keys, ticks = twin.directory()
    assert sorted(keys[ticks != 0].tolist()) == [1, 5]  # ascending keys take the ways first
    assert twin.cache_stats()["cache_misses"] == 4


def test_a_refused_pull_changes_neither_the_cache_nor_the_counters() -> None:
    spec = spec_of(gpu_cache={"rows": 16, "ways": 4})
    twin, _ = twin_and_host(spec)
    twin.pull(np.arange(10, dtype=np.int64), rows(spec, 10))
    before = (twin.directory(), twin.cache_stats(), twin.size)
    bad = np.array([1, 2, spec.num_embeddings], dtype=np.int64)
    with pytest.raises(ValueError, match=r"out of range|outside"):
        twin.pull(bad, rows(spec, 3))
    after = (twin.directory(), twin.cache_stats(), twin.size)
    assert np.array_equal(before[0][0], after[0][0])
    assert np.array_equal(before[0][1], after[0][1])
    assert before[1:] == after[1:]


def test_stats_carry_the_host_tier_and_the_cache() -> None:
    spec = spec_of(gpu_cache={"rows": 16, "ways": 4})
    twin, _ = twin_and_host(spec)
    twin.pull(np.array([1, 1, 2], dtype=np.int64), rows(spec, 3))
    twin.pull(np.array([1], dtype=np.int64), rows(spec, 1))
    stats = twin.stats()
    assert stats["size"] == 2 and stats["capacity"] == spec.num_embeddings
    assert (stats["cache_hits"], stats["cache_misses"]) == (1, 3)
    assert stats["cache_bytes"] == 16 * (spec.row_bytes + 16)


@pytest.mark.parametrize(
    ("rows_wanted", "ways", "geometry"),
    [(10, 4, (2, 4)), (3, 8, (1, 3)), (10_000, 8, (50, 8))],  # capped at the 400 rows held
)
def test_cache_geometry(rows_wanted: int, ways: int, geometry: tuple[int, int]) -> None:
    twin, _ = twin_and_host(spec_of(gpu_cache={"rows": rows_wanted, "ways": ways}))
    assert (twin.cache_sets, twin.cache_ways) == geometry


def test_native_cache_options_are_checked() -> None:
    options = native_options(spec_of(), 0, 1, _native)
    cache = _native.CacheOptions()
    cache.rows, cache.ways = 8, 0
    with pytest.raises(ValueError, match="ways"):
        _native.CacheTable(options, cache)
    cache.ways, cache.rows = 4, 0
    with pytest.raises(ValueError, match="rows"):
        _native.CacheTable(options, cache)
    cache.rows, cache.bytes = 8, 64
    with pytest.raises(ValueError, match="one of them"):
        _native.CacheTable(options, cache)
    cache.rows, cache.bytes = 0, 31  # rows of 32 bytes
    with pytest.raises(ValueError, match="hold no row"):
        _native.CacheTable(options, cache)
    cache.bytes = 0
    hashed = native_options(
        spec_of(storage="host", keys={"mode": "hashed", "eviction": "lru"}), 0, 1, _native
    )
    cache.rows = 8
    with pytest.raises(ValueError, match="eviction"):
        _native.CacheTable(hashed, cache)


def test_cache_size_per_shard() -> None:
    assert cache_size(spec_of(), 0, 1) == (40, 0)  # 10% of 400
    assert cache_size(spec_of(gpu_cache={"rows": 100}, shards=3), 0, 3) == (34, 0)
    assert cache_size(spec_of(gpu_cache={"bytes": 3200}, shards=2), 1, 2) == (0, 1600)


def test_a_cache_sized_in_bytes_holds_the_rows_that_fit() -> None:
    # 32-byte rows, each with its 16-byte slot: 20 of them and change
    twin, _ = twin_and_host(spec_of(gpu_cache={"bytes": (32 + 16) * 20 + 47, "ways": 4}))
    assert (twin.cache_sets, twin.cache_ways) == (5, 4)
    assert twin.stats()["cache_bytes"] <= (32 + 16) * 20 + 47


def test_the_spec_knows_the_engine_slot_size() -> None:
    from recstore.core.spec import GPU_CACHE_SLOT_BYTES

    assert GPU_CACHE_SLOT_BYTES == _native.CACHE_SLOT_BYTES


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"keys": {"mode": "hashed", "eviction": "lru"}}, "do not apply"),
        ({"keys": {"mode": "hashed", "ttl_seconds": 5}}, "do not apply"),
        ({"storage": "host", "gpu_cache": {"rows": 5}}, "storage: gpu_cache only"),
        ({"gpu_cache": {"rows": 5, "bytes": 100}}, "not both"),
        ({"gpu_cache": {"bytes": 40}, "shards": 2}, "holds no row"),
        ({"gpu_cache": {"bytes": 47}}, "holds no row"),  # a 32-byte row and its 16-byte slot
        ({"gpu_cache": {"ways": 33}}, "ways"),
    ],
)
def test_bad_gpu_cache_specs_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec_of(**fields)


def test_the_camel_case_wire_form_round_trips() -> None:
    spec = spec_of(gpu_cache={"rows": 10, "ways": 2})
    wire = spec.to_wire()
    assert wire["storage"] == "gpu_cache" and wire["gpuCache"]["rows"] == 10
    assert TableSpec.model_validate(wire) == spec


def test_without_a_gpu_the_tier_is_refused_clearly() -> None:
    with pytest.raises(DeviceUnavailable, match=r"storage: gpu_cache.*device cpu"):
        Table(spec_of(), device="cpu")
    if not _native.cuda_available():
        with pytest.raises(DeviceUnavailable, match=r"storage: gpu_cache.*cannot use one"):
            Table(spec_of(), device="cuda")


def test_a_gpu_cache_shard_runs_on_a_gpu_node() -> None:
    decl = parse_declaration(
        {"numEmbeddings": 10, "embeddingDim": 4, "storage": "gpu_cache", "placement": {"gpus": 1}},
        default_name="t",
    )
    args = ps_node_args(decl, shard_index=0)
    assert args[args.index("--device") + 1] == "cuda"
