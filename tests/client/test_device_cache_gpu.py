"""The Hierarchical layer's GPU cache on a CUDA device (skipped without one): the tier on
the GPU against its CPU run on the same trace, and the public layer end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import recstore.nve as nve
from recstore.client import RecStoreClient
from recstore.client.host_cache import WAYS, bytes_per_row
from recstore.client.nve.device_cache import DeviceRowCache

from .conftest import unique_name

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROWS, DIM = 1000, 4


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_the_tier_on_the_gpu_matches_its_cpu_run(policy: str) -> None:
    capacity = 16 * WAYS * bytes_per_row(DIM * 4)
    cpu = DeviceRowCache(capacity, DIM, torch.float32, "cpu", policy=policy)
    gpu = DeviceRowCache(capacity, DIM, torch.float32, "cuda", policy=policy)
    rng = np.random.default_rng(5)
    weights = 1.0 / np.arange(1, 4001) ** 1.05
    weights /= weights.sum()
    for step in range(100):
        keys = torch.from_numpy(np.unique(rng.choice(4000, size=80, p=weights)))
        rows = keys.to(torch.float32)[:, None].expand(-1, DIM).contiguous()
        since = step - 2 if step % 7 == 0 else None
        hit, slots = cpu.lookup(keys, read_since=since)
        gpu_hit, gpu_slots = gpu.lookup(keys.cuda(), read_since=since)
        assert torch.equal(gpu_hit.cpu(), hit) and torch.equal(gpu_slots.cpu(), slots)
        torch.testing.assert_close(gpu.rows(gpu_slots).cpu(), cpu.rows(slots))
        cpu.insert(keys[~hit], rows[~hit], step)
        gpu.insert(keys[~hit].cuda(), rows[~hit].cuda(), step)
        for mine, theirs in zip(gpu.directory(), cpu.directory(), strict=True):
            assert np.array_equal(mine, theirs)
    assert vars(gpu.stats) == vars(cpu.stats)


def test_a_hierarchical_layer_with_a_gpu_cache_serves_exact_rows_on_the_gpu(
    local_client: RecStoreClient,
) -> None:
    name = unique_name()
    layer = nve.NVEmbedding(
        num_embeddings=ROWS, embedding_size=DIM, data_type=torch.float32,
        layer_type=nve.LayerType.Hierarchical, gpu_cache_size=1 << 20,
        storage=nve.RemoteTable(local_client, name), optimize_for_training=False,
        config={"host_cache_size": 1 << 16},
    )  # fmt: skip
    keys = torch.tensor([1, 2, 999, 2], device="cuda")
    first = layer(keys)
    assert first.device == keys.device
    torch.testing.assert_close(first.cpu(), local_client.pull(name, keys.cpu()))
    torch.testing.assert_close(layer(keys), first)
    local_client.push(name, torch.tensor([999]), torch.full((1, DIM), 3.0))
    torch.testing.assert_close(layer(keys).cpu(), local_client.pull(name, keys.cpu()))
    gpu = layer.cache_stats()["gpu"]
    assert isinstance(gpu, dict)
    assert (gpu["hits"], gpu["invalidations"]) == (3, 1)


def test_training_with_a_gpu_cache_updates_the_table(local_client: RecStoreClient) -> None:
    name = unique_name()
    layer = nve.NVEmbedding(
        ROWS, DIM, gpu_cache_size=1 << 20, storage=nve.RemoteTable(local_client, name),
        config={"max_staleness_steps": 1},
    )  # fmt: skip
    keys = torch.tensor([4, 5], device="cuda")
    before = layer(keys)
    before.sum().backward()
    lr = local_client.learning_rate
    torch.testing.assert_close(local_client.pull(name, keys.cpu()), before.detach().cpu() - lr)


def test_the_reference_parameter_server_snippet_runs_with_its_gpu_cache(
    local_client: RecStoreClient,
) -> None:
    storage = nve.RemoteTable(local_client, unique_name())
    embedding = nve.NVEmbedding(
        num_embeddings=10 * 1024,  # the reference's 10M rows cut to fit a test
        embedding_size=1,
        data_type=torch.float32,
        layer_type=nve.LayerType.Hierarchical,
        gpu_cache_size=1024 * 1024,
        storage=storage,
    )
    keys = torch.Tensor([1, 2, 1000]).to(torch.int64).to(device="cuda")
    emb = embedding(keys)
    assert emb.shape == (3, 1) and emb.device == keys.device
