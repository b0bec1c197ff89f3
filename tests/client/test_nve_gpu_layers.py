"""The GPU layer types on a GPU: ``GPULayer`` (rows in GPU memory) and ``LinearUVM``
(host rows behind the engine's GPU cache), against torch.nn and torch.optim.SGD.

Run by scripts/gpu_check.sh; without a GPU the types refuse with a clear error
(tests/client/test_nve.py).
"""

from __future__ import annotations

import logging

import pytest
import torch

import recstore.nve as nve
import recstore.nve as nve_layers
from recstore.client import RecStoreClient
from recstore.client.nve.device_tables import in_process_client

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROWS, DIM, LR, STEPS = 5000, 16, 0.01, 5
#: each type with the gpu_cache_size it takes: LinearUVM caches a tenth of the rows
TYPES = [(nve.LayerType.GPULayer, 0), (nve.LayerType.LinearUVM, ROWS // 10 * DIM * 4)]
TYPE_IDS = ["gpu_layer", "linear_uvm"]


def test_quick_start_snippet_runs_on_the_gpu() -> None:
    weight_init = torch.randn(10 * 1024 * 1024, 1, dtype=torch.float32)
    embedding = nve_layers.NVEmbedding(
        num_embeddings=10 * 1024 * 1024,
        embedding_size=1,
        data_type=torch.float32,
        layer_type=nve_layers.LayerType.LinearUVM,
        gpu_cache_size=1024 * 1024,
        weight_init=weight_init,
    )
    keys = torch.Tensor([1, 2, 1000]).to(torch.int64).to(device="cuda")
    emb = embedding(keys)
    assert emb.device.type == "cuda"
    torch.testing.assert_close(emb.cpu(), weight_init[[1, 2, 1000]], rtol=0, atol=0)


def test_layer_configuration_snippet_runs_and_logs_its_cache(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu_cache_size = ROWS // 10 * DIM * 4
    embedding = nve_layers.NVEmbedding(
        ROWS,
        DIM,
        torch.float32,
        nve_layers.LayerType.LinearUVM,
        gpu_cache_size=gpu_cache_size,
        config={
            "logging_interval": 2,
            "kernel_mode": 0,
            "kernel_mode_value_1": 0,
            "kernel_mode_value_2": 0,
            "max_modify_size": 1 << 20,
        },
    )
    keys = torch.arange(100, device="cuda")
    with caplog.at_level(logging.INFO, logger="recstore.nve"):
        first, second = embedding(keys), embedding(keys)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    stats = embedding.cache_stats()
    assert stats["enabled"] and stats["tier"] == "gpu" and stats["lookups"] == 2
    assert stats["misses"] == 100 and stats["hits"] == 100 and stats["hit_rate"] == 0.5
    assert 0 < int(stats["capacity_bytes"]) <= gpu_cache_size  # type: ignore[call-overload]
    assert any("hits=100 misses=100" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("layer_type", "cache"), TYPES, ids=TYPE_IDS)
def test_embedding_trains_like_torch(layer_type: nve.LayerType, cache: int) -> None:
    weight = torch.randn(ROWS, DIM)
    layer = nve.NVEmbedding(ROWS, DIM, layer_type=layer_type, gpu_cache_size=cache,
                            weight_init=weight)  # fmt: skip
    reference = torch.nn.Embedding.from_pretrained(weight.cuda(), freeze=False)
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        keys = torch.randint(0, ROWS, (4, 256), generator=generator).cuda()  # repeats too
        ours, theirs = layer(keys), reference(keys)
        assert ours.device == keys.device and ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs)
        (ours * ours).sum().backward()
        (theirs * theirs).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        every = torch.arange(ROWS, device="cuda")
        torch.testing.assert_close(layer(every), reference.weight)


@pytest.mark.parametrize(("layer_type", "cache"), TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bag_trains_like_torch(layer_type: nve.LayerType, cache: int, mode: str) -> None:
    weight = torch.randn(ROWS, DIM)
    layer = nve.NVEmbeddingBag(ROWS, DIM, layer_type=layer_type, gpu_cache_size=cache,
                               weight_init=weight, mode=mode)  # fmt: skip
    reference = torch.nn.EmbeddingBag.from_pretrained(weight.cuda(), mode=mode, freeze=False)
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(1)
    offsets = torch.arange(0, 1024, 8, device="cuda")
    for _ in range(STEPS):
        keys = torch.randint(0, ROWS // 4, (1024,), generator=generator).cuda()
        ours, theirs = layer(keys, offsets), reference(keys, offsets)
        torch.testing.assert_close(ours, theirs)
        ours.pow(2).sum().backward()
        theirs.pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():  # one key per bag: every mode gives the row itself
        every = torch.arange(ROWS, device="cuda")
        torch.testing.assert_close(layer(every, every), reference.weight)


def test_an_inference_layer_reads_and_refuses_training() -> None:
    weight = torch.randn(ROWS, DIM)
    layer = nve.NVEmbedding(ROWS, DIM, layer_type=nve.LayerType.GPULayer, weight_init=weight,
                            optimize_for_training=False)  # fmt: skip
    keys = torch.tensor([3, 1, 3], device="cuda")
    rows = layer(keys)
    torch.testing.assert_close(rows.cpu(), weight[[3, 1, 3]], rtol=0, atol=0)
    assert not rows.requires_grad


def test_a_named_in_process_table_takes_its_optimizer() -> None:
    from recstore.core import Optimizer

    client = RecStoreClient(role="test-nve-gpu-named")
    client.set_ps_backend("local")
    name = f"nve_named_{id(client)}"
    storage = nve.RemoteTable(client, name, optimizer=Optimizer(kind="adagrad", lr=0.1))
    weight = torch.randn(ROWS, DIM)
    layer = nve.NVEmbedding(ROWS, DIM, layer_type=nve.LayerType.GPULayer, storage=storage,
                            weight_init=weight)  # fmt: skip
    assert name in client.data_name_list()
    reference = torch.nn.Embedding.from_pretrained(weight.cuda(), freeze=False)
    optimizer = torch.optim.Adagrad(reference.parameters(), lr=0.1)
    keys = torch.tensor([5, 9, 5, 7], device="cuda")
    for _ in range(3):
        layer(keys).sum().backward()
        reference(keys).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.testing.assert_close(layer(keys), reference(keys))


@pytest.mark.parametrize(
    ("layer_type", "cache", "config", "message"),
    [
        (nve.LayerType.GPULayer, 1024, None, "gpu_cache_size must be 0"),
        (nve.LayerType.LinearUVM, 0, None, "gpu_cache_size must be > 0"),
        (nve.LayerType.LinearUVM, 4096, {"host_cache_size": 4096}, "host_cache_size"),
        (nve.LayerType.GPULayer, 0, {"max_staleness_steps": 2}, "max_staleness_steps"),
    ],
)
def test_bad_options_are_refused_before_a_table_exists(
    layer_type: nve.LayerType, cache: int, config: dict[str, int] | None, message: str
) -> None:
    client = in_process_client()
    before = set(client.data_name_list())
    with pytest.raises(ValueError, match=message):
        nve.NVEmbedding(ROWS, DIM, layer_type=layer_type, gpu_cache_size=cache, config=config)
    assert set(client.data_name_list()) == before


def test_keys_must_be_on_the_layer_device() -> None:
    layer = nve.NVEmbedding(ROWS, DIM, layer_type=nve.LayerType.GPULayer)
    with pytest.raises(ValueError, match="move them to the layer's device"):
        layer(torch.tensor([1, 2]))


def test_a_table_on_remote_nodes_is_refused() -> None:
    client = RecStoreClient(role="test-nve-gpu-remote")
    client.set_ps_backend("grpc")
    with pytest.raises(TypeError, match="in-process"):
        nve.NVEmbedding(ROWS, DIM, layer_type=nve.LayerType.GPULayer,
                        storage=nve.RemoteTable(client, "elsewhere"))  # fmt: skip


def test_a_linear_uvm_cache_is_exported_to_prometheus() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    nve.register_cache_metrics(registry)
    layer = nve.NVEmbedding(ROWS, DIM, layer_type=nve.LayerType.LinearUVM,
                            gpu_cache_size=ROWS // 10 * DIM * 4)  # fmt: skip
    keys = torch.arange(50, device="cuda")
    layer(keys)
    layer(keys)
    labels = {"table": layer.name, "layer": layer.name, "tier": "gpu"}
    assert registry.get_sample_value("recstore_nve_cache_hits_total", labels) == 50
    assert registry.get_sample_value("recstore_nve_cache_misses_total", labels) == 50
    assert registry.get_sample_value("recstore_nve_cache_hit_rate", labels) == 0.5
    assert registry.get_sample_value("recstore_nve_cache_insertions_total", labels) is None


@pytest.mark.parametrize(("layer_type", "cache"), TYPES, ids=TYPE_IDS)
def test_state_dict_carries_the_rows_both_ways(layer_type: nve.LayerType, cache: int) -> None:
    """A torch.nn.Embedding state dict loads into a GPU layer, and its state dict back."""
    weight = torch.randn(ROWS, DIM)
    layer = nve.NVEmbedding(ROWS, DIM, layer_type=layer_type, gpu_cache_size=cache)
    keys = torch.randint(0, ROWS, (64,)).cuda()
    layer(keys)  # a LinearUVM cache now holds rows the load replaces
    layer.load_state_dict(torch.nn.Embedding(ROWS, DIM, _weight=weight).state_dict())
    torch.testing.assert_close(layer(keys).cpu(), weight[keys.cpu()])
    back = torch.nn.Embedding(ROWS, DIM)
    back.load_state_dict(layer.state_dict())
    torch.testing.assert_close(back.weight.detach(), weight)
