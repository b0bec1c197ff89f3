"""The GPU cache tier of a Hierarchical NVE layer, run on CPU tensors on every machine:
held to the host cache's policy model slot by slot, within its bytes, exact after a
write, within k steps of the table in training, refusing bad sizes."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import recstore.nve as nve
from recstore.client import RecStoreClient
from recstore.client.host_cache import WAYS, bytes_per_row, to_bits
from recstore.client.nve import layers
from recstore.client.nve.cached import CachedTable
from recstore.client.nve.device_cache import DeviceRowCache, tier_sets
from recstore.client.nve.device_cache_tiers import DeviceCachedTable

from .conftest import unique_name
from .host_cache_model import HostCache

ROWS, DIM = 1000, 4
ROW_COST = bytes_per_row(DIM * 4)
COUNTED = ("hits", "misses", "evictions", "insertions", "rejected", "invalidations")


def zipf_batches(
    n_batches: int, size: int, ids: int, alpha: float, seed: int
) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, ids + 1) ** alpha
    weights /= weights.sum()
    permutation = rng.permutation(ids)
    for _ in range(n_batches):
        yield np.unique(permutation[rng.choice(ids, size=size, p=weights)]).astype(np.int64)


def rows_of(keys: np.ndarray) -> np.ndarray:
    """A row that names its key, so a served row can be checked."""
    return np.repeat(keys.astype(np.float32)[:, None], DIM, axis=1)


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_the_tier_follows_the_host_cache_model_on_a_zipf_trace(policy: str) -> None:
    capacity = 12 * WAYS * ROW_COST  # 96 rows against 5000 ids: evicts, ages, rejects
    model = HostCache(capacity, DIM, torch.float32, policy=policy)
    tier = DeviceRowCache(capacity, DIM, torch.float32, "cpu", policy=policy)
    assert tier.capacity_rows == model.capacity_rows == 96
    for step, keys in enumerate(zipf_batches(150, 64, 5000, 1.05, seed=7)):
        since = step - 3 if step % 5 == 0 else None  # now and then, drop rows read long ago
        hit, slots = model.lookup(keys, read_since=since)
        tier_hit, tier_slots = tier.lookup(torch.from_numpy(keys), read_since=since)
        assert np.array_equal(tier_hit.numpy(), hit)
        assert np.array_equal(tier_slots.numpy(), slots)
        served = tier.rows(tier_slots).numpy()
        assert np.array_equal(served, rows_of(keys[hit]))
        missed = keys[~hit]
        model.insert(missed, to_bits(torch.from_numpy(rows_of(missed))), step)
        tier.insert(torch.from_numpy(missed), torch.from_numpy(rows_of(missed)), step)
        model_keys, model_stamps = model._keys, model._stamps
        tier_keys, tier_stamps = tier.directory()
        assert np.array_equal(tier_keys, model_keys), f"batch {step}"
        assert np.array_equal(tier_stamps, model_stamps), f"batch {step}"
        assert tier.bytes_used == model.bytes_used
    for counter in COUNTED:
        assert getattr(tier.stats, counter) == getattr(model.stats, counter), counter
    stats = tier.stats
    assert stats.hits > 0 and stats.evictions > 0
    if policy == "lfu":
        assert stats.rejected > 0  # the admission rule kept one-off ids out


@pytest.mark.parametrize("capacity", [8 * ROW_COST, 8 * ROW_COST + 1, 1 << 16, 100_000])
def test_everything_the_tier_allocates_stays_within_its_bytes(capacity: int) -> None:
    tier = DeviceRowCache(capacity, DIM, torch.float32, "cpu")
    held = (tier._rows, tier._keys, tier._stamps, tier._born, tier._sketch)
    allocated = sum(t.numel() * t.element_size() for t in held)
    assert allocated == tier.capacity_bytes_used <= capacity
    assert capacity - tier.capacity_bytes_used < WAYS * ROW_COST  # no set left unused
    for keys in zipf_batches(20, 400, 2000, 0.8, seed=1):
        hit, _ = tier.lookup(torch.from_numpy(keys))
        missed = torch.from_numpy(keys[~hit.numpy()])
        tier.insert(missed, torch.from_numpy(rows_of(missed.numpy())))
    assert 0 < tier.bytes_used <= tier.capacity_bytes_used
    assert tier.bytes_used == tier.resident_rows * ROW_COST


def test_bad_sizes_and_settings_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"gpu_cache_size=100 bytes holds no set of 8 rows"):
        DeviceRowCache(100, DIM, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"needs at least \d+ bytes"):
        tier_sets(8 * ROW_COST - 1, DIM, torch.float32)
    with pytest.raises(TypeError, match="gpu_cache_size must be an int of bytes"):
        tier_sets(True, DIM, torch.float32)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="floating-point rows"):
        tier_sets(1 << 20, DIM, torch.int64)
    with pytest.raises(ValueError, match="cache policy must be one of"):
        DeviceRowCache(1 << 20, DIM, torch.float32, "cpu", policy="fifo")


# -- through the host cache and the table -------------------------------------------
def _tiers(
    client: RecStoreClient, name: str, host_bytes: int, gpu_bytes: int, **options: object
) -> DeviceCachedTable:
    lower = CachedTable(client, name, "layer", DIM, torch.float32, host_bytes, **options)  # type: ignore[arg-type]
    policy = str(options.get("policy", "lfu"))
    return DeviceCachedTable(
        lower, DeviceRowCache(gpu_bytes, DIM, torch.float32, "cpu", policy=policy)
    )


@pytest.mark.parametrize("host_bytes", [0, 1 << 16])
def test_inference_reads_stay_exact_after_a_write(
    any_client: RecStoreClient, host_bytes: int
) -> None:
    name = unique_name()
    any_client.init_data(name, (ROWS, DIM), torch.float32)
    tiers = _tiers(any_client, name, host_bytes, 1 << 16)
    keys = torch.tensor([1, 2, 600, 2, 999])
    first = tiers.read(keys)
    torch.testing.assert_close(first, any_client.pull(name, keys))
    torch.testing.assert_close(tiers.read(keys), first)
    assert (tiers.tier.stats.hits, tiers.tier.stats.misses) == (4, 4)
    any_client.push(name, torch.tensor([600]), torch.full((1, DIM), 7.0))
    after = tiers.read(keys)  # every key hit on the device: the table's version says stale
    torch.testing.assert_close(after, any_client.pull(name, keys))
    assert float(after[2, 0]) == 7.0
    stats = tiers.tier.stats
    assert stats.invalidations == 1
    assert (stats.hits, stats.misses) == (4, 8)  # the stale lookup's hits count as misses
    torch.testing.assert_close(tiers.read(keys), after)
    assert tiers.tier.stats.hits == 8


def test_version_check_interval_bounds_both_tiers(grpc_client: RecStoreClient) -> None:
    """Within T seconds of a node's confirmation a lookup whose keys all hit on the GPU
    goes nowhere (and may be stale); the first lookup T later sees the write."""
    name = unique_name()
    grpc_client.init_data(name, (ROWS, DIM), torch.float32)
    tiers = _tiers(grpc_client, name, 1 << 16, 1 << 16, version_check_interval=10.0)
    now = [0.0]
    tiers.lower.freshness.clock = lambda: now[0]
    keys = torch.arange(0, ROWS, 97)
    before = tiers.read(keys)  # t = 0: every node asked, every version confirmed
    now[0] = 2.0
    grpc_client.push(name, keys[:1], torch.full((1, DIM), 5.0))  # acknowledged at t = 2
    now[0] = 9.5
    torch.testing.assert_close(tiers.read(keys), before)  # within the bound: stale, allowed
    now[0] = 10.0
    after = tiers.read(keys)
    torch.testing.assert_close(after, grpc_client.pull(name, keys))
    assert float(after[0, 0]) == 5.0
    assert tiers.tier.stats.invalidations == 1


@pytest.mark.parametrize("k", [0, 1, 3])
def test_training_rows_are_at_most_k_steps_old_across_both_tiers(
    local_client: RecStoreClient, k: int
) -> None:
    """Each step reads, then writes every key's row to the step number. A GPU tier of one
    set in front of a host cache holding every key: rows often reach the GPU tier from
    the host cache, already up to k steps old, and must not serve past k steps in all."""
    name = unique_name()
    keys = torch.arange(20)
    local_client.init_data(name, (ROWS, DIM), torch.float32)
    local_client.push(name, keys, torch.zeros((20, DIM)))
    tiers = _tiers(local_client, name, 1 << 16, 8 * ROW_COST, max_staleness_steps=k, policy="lru")
    rng = np.random.default_rng(3)
    oldest = 0
    for step in range(1, 60):
        tiers.lower.step = step
        batch = torch.from_numpy(rng.choice(20, size=10, replace=False))
        seen = tiers.read(batch)[:, 0]
        assert bool((seen <= step - 1).all())
        assert bool((seen >= step - 1 - k).all()), (step, seen.tolist())
        oldest = max(oldest, int((step - 1 - seen).max()))
        local_client.push(name, keys, torch.full((20, DIM), float(step)))
    assert oldest == k  # the bound is reached, not only respected
    assert tiers.tier.stats.hits > 0 or k == 0


# -- the public layer, with the device rule set aside so its tier runs on the CPU ----
@pytest.fixture
def cpu_gpu_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a Hierarchical layer with gpu_cache_size > 0 live on the CPU: the device rule
    (a CUDA device) is resolve_device's, tested in test_nve.py."""
    monkeypatch.setattr(layers, "resolve_device", lambda *_: torch.device("cpu"))


def test_a_layer_reports_both_tiers_and_logs_them(
    local_client: RecStoreClient, cpu_gpu_cache: None, caplog: pytest.LogCaptureFixture
) -> None:
    layer = nve.NVEmbedding(
        ROWS, DIM, layer_type=nve.LayerType.Hierarchical, gpu_cache_size=1 << 14,
        storage=nve.RemoteTable(local_client, unique_name()), optimize_for_training=False,
        config={"host_cache_size": 1 << 16, "logging_interval": 2},
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="recstore.nve"):
        for _ in range(4):
            rows = layer(torch.tensor([1, 2, 2]))
    torch.testing.assert_close(rows, local_client.pull(layer.storage.name, torch.tensor([1, 2, 2])))
    stats = layer.cache_stats()
    gpu = stats["gpu"]
    assert isinstance(gpu, dict)
    assert (gpu["hits"], gpu["misses"], gpu["hit_rate"]) == (6, 2, 0.75)
    assert (stats["hits"], stats["misses"]) == (0, 2)  # the host tier saw the GPU misses only
    assert 0 < gpu["bytes_used"] <= gpu["capacity_bytes"] <= 1 << 14
    lines = [r.getMessage() for r in caplog.records if r.name == "recstore.nve"]
    assert "gpu_hits=6 gpu_misses=2 gpu_hit_rate=0.7500 gpu_evictions=0" in lines[-1]


def test_the_prometheus_collector_labels_each_tier(
    local_client: RecStoreClient, cpu_gpu_cache: None
) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    nve.register_cache_metrics(registry)
    layer = nve.NVEmbedding(
        ROWS, DIM, gpu_cache_size=1 << 14, storage=nve.RemoteTable(local_client, unique_name()),
        optimize_for_training=False, config={"host_cache_size": 1 << 16},
    )  # fmt: skip
    for _ in range(3):
        layer(torch.tensor([1, 2, 2]))
    stats = layer.cache_stats()
    for tier in (stats, stats["gpu"]):
        assert isinstance(tier, dict)
        labels = {"table": layer.storage.name, "layer": layer.name, "tier": str(tier["tier"])}
        for name in ("hits", "misses", "evictions"):
            value = registry.get_sample_value(f"recstore_nve_cache_{name}_total", labels)
            assert value == tier[name]
        assert registry.get_sample_value("recstore_nve_cache_hit_rate", labels) == tier["hit_rate"]
        for name in ("bytes_used", "capacity_bytes"):
            assert registry.get_sample_value(f"recstore_nve_cache_{name}", labels) == tier[name]
    gpu = {"table": layer.storage.name, "layer": layer.name, "tier": "gpu"}
    assert registry.get_sample_value("recstore_nve_cache_hits_total", gpu) == 4


def test_a_too_small_gpu_cache_is_refused_before_the_table(
    local_client: RecStoreClient, cpu_gpu_cache: None
) -> None:
    storage = nve.RemoteTable(local_client, unique_name())
    with pytest.raises(ValueError, match="gpu_cache_size=64 bytes holds no set"):
        nve.NVEmbedding(ROWS, DIM, gpu_cache_size=64, storage=storage)
    assert storage.name not in local_client.data_name_list()


def test_training_goes_through_the_optimizer_and_caches_only_with_a_bound(
    local_client: RecStoreClient, cpu_gpu_cache: None
) -> None:
    name = unique_name()
    exact = nve.NVEmbedding(
        ROWS, DIM, gpu_cache_size=1 << 14, storage=nve.RemoteTable(local_client, name)
    )
    assert not exact.cache_stats()["enabled"]  # training: off unless max_staleness_steps
    stale = nve.NVEmbedding(
        ROWS, DIM, gpu_cache_size=1 << 14, storage=nve.RemoteTable(local_client, name),
        config={"max_staleness_steps": 1},
    )  # fmt: skip
    keys = torch.tensor([4])
    rows = [stale(keys)]
    rows[0].sum().backward()  # step 1 read row 4, then updated it
    rows.append(stale(keys))  # step 2: served by the GPU tier, one step old
    rows[1].sum().backward()
    rows.append(stale(keys))  # step 3: too old, read again: two updates in
    lr = local_client.learning_rate
    torch.testing.assert_close(rows[1], rows[0])
    torch.testing.assert_close(rows[2], rows[0] - 2 * lr)
    torch.testing.assert_close(exact(keys), rows[2])
    gpu = stale.cache_stats()["gpu"]
    assert isinstance(gpu, dict) and gpu["hits"] == 1
