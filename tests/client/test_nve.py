"""``recstore.nve``: the reference's snippets (docs nv-embedding-cache-python-api) and rules.

Sizes in the snippets are cut down where the reference's would not fit a test
machine (10M x 128 float32 is 5 GB); everything else is as written there. On a
machine without a GPU the GPU layer types must refuse with an error that names
the missing GPU; ``HostLayer`` and ``Hierarchical`` with a host cache run.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.export import Dim

import recstore.nve as nve
import recstore.nve as nve_layers
from recstore import export
from recstore import nn as rnn
from recstore.client import RecStoreClient, checkpoint
from recstore.client.errors import IdDtypeError
from recstore.nn import optimizer_state as rnn_optimizer_state

from .conftest import unique_name

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
ROWS, DIM = 1000, 8


# -- the reference's snippets ---------------------------------------------------------
@NO_GPU
def test_quick_start_linear_uvm_names_the_missing_gpu() -> None:
    weight_init = torch.randn(10 * 1024, 1, dtype=torch.float32)
    with pytest.raises(RuntimeError, match=r"LayerType.LinearUVM needs a CUDA GPU"):
        nve_layers.NVEmbedding(
            num_embeddings=10 * 1024,
            embedding_size=1,
            data_type=torch.float32,
            layer_type=nve_layers.LayerType.LinearUVM,
            gpu_cache_size=1024 * 1024,
            weight_init=weight_init,
        )


@NO_GPU
def test_layer_configuration_snippet_names_the_missing_gpu() -> None:
    with pytest.raises(RuntimeError, match=r"torch\.cuda\.is_available"):
        nve_layers.NVEmbedding(
            ROWS,
            DIM,
            torch.float32,
            nve_layers.LayerType.LinearUVM,
            gpu_cache_size=1 << 20,
            config={
                "logging_interval": 1000,
                "kernel_mode": 0,
                "kernel_mode_value_1": 0,
                "kernel_mode_value_2": 0,
                "max_modify_size": 1 << 20,
            },
        )
    with pytest.raises(RuntimeError, match="GPULayer needs a CUDA GPU"):
        nve_layers.NVEmbedding(ROWS, DIM, torch.float32, nve_layers.LayerType.GPULayer)


@NO_GPU
def test_parameter_server_snippet_with_a_gpu_cache_names_the_missing_gpu(
    any_client: RecStoreClient,
) -> None:
    storage = nve.RemoteTable(any_client, unique_name())
    with pytest.raises(RuntimeError, match="Hierarchical with gpu_cache_size=1048576 needs a"):
        nve_layers.NVEmbedding(
            num_embeddings=ROWS,
            embedding_size=1,
            data_type=torch.float32,
            layer_type=nve_layers.LayerType.Hierarchical,
            gpu_cache_size=1024 * 1024,
            storage=storage,
        )
    assert storage.name not in any_client.data_name_list()  # refused before the table


def test_parameter_server_snippet_with_a_host_cache_runs(any_client: RecStoreClient) -> None:
    name = unique_name()
    embedding = nve_layers.NVEmbedding(
        num_embeddings=ROWS,
        embedding_size=DIM,
        data_type=torch.float32,
        layer_type=nve_layers.LayerType.Hierarchical,
        gpu_cache_size=0,
        storage=nve.RemoteTable(any_client, name),
        optimize_for_training=False,
        config={"host_cache_size": 1 << 16},
        device="cpu",
    )
    keys = torch.tensor([1, 2, 1000 - 1, 2], dtype=torch.int64)
    expected = any_client.pull(name, keys)
    torch.testing.assert_close(embedding(keys), expected, rtol=0, atol=0)
    torch.testing.assert_close(embedding(keys), expected, rtol=0, atol=0)
    stats = embedding.cache_stats()
    assert (stats["hits"], stats["misses"], stats["table"]) == (3, 3, name)
    assert 0 < stats["bytes_used"] <= stats["capacity_bytes"] <= 1 << 16


def test_host_layer_snippet_runs_on_the_cpu() -> None:
    embedding = nve_layers.NVEmbedding(
        num_embeddings=10 * 1024,
        embedding_size=128,
        data_type=torch.float32,
        layer_type=nve_layers.LayerType.HostLayer,
        optimize_for_training=False,  # required — HostLayer is inference-only
        device=torch.device("cpu"),
    )
    keys = torch.tensor([1, 2, 1000])
    out = embedding(keys)
    assert out.shape == (3, 128) and out.device.type == "cpu"


def test_host_mem_block_snippet_runs() -> None:
    memblock = nve.HostMemBlock(
        row_size=128, num_embeddings=10 * 1024, dtype=nve.DataType_t.Float32
    )
    memblock.tensor[7] = 3.0
    embedding = nve_layers.NVEmbedding(
        num_embeddings=10 * 1024,
        embedding_size=128,
        data_type=torch.float32,
        layer_type=nve_layers.LayerType.HostLayer,
        optimize_for_training=False,
        storage=memblock,
    )
    torch.testing.assert_close(
        embedding(torch.tensor([7]).to(embedding.device)).cpu(), torch.full((1, 128), 3.0)
    )


# -- the documented rules --------------------------------------------------------------
def test_host_layer_rules() -> None:
    with pytest.raises(ValueError, match="optimize_for_training=False"):
        nve.NVEmbedding(ROWS, DIM, torch.float32, nve.LayerType.HostLayer, device="cpu")
    with pytest.raises(ValueError, match=r"NVEmbeddingBag does not support LayerType\.HostLayer"):
        nve.NVEmbeddingBag(
            ROWS,
            DIM,
            torch.float32,
            nve.LayerType.HostLayer,
            optimize_for_training=False,
            device="cpu",
        )
    with pytest.raises(TypeError, match="host memory"):
        nve.NVEmbedding(
            ROWS,
            DIM,
            torch.float32,
            nve.LayerType.HostLayer,
            optimize_for_training=False,
            device="cpu",
            storage=object(),
        )
    with pytest.raises(ValueError, match="memory block holds"):
        nve.NVEmbedding(
            ROWS,
            DIM,
            torch.float32,
            nve.LayerType.HostLayer,
            optimize_for_training=False,
            device="cpu",
            storage=nve.HostMemBlock(DIM, ROWS + 1),
        )


def test_config_keys_are_checked(local_client: RecStoreClient) -> None:
    storage = nve.RemoteTable(local_client, unique_name())
    with pytest.raises(ValueError, match=r"unknown config keys \['cache_sise'\]"):
        nve.NVEmbedding(ROWS, DIM, config={"cache_sise": 1}, storage=storage, device="cpu")
    with pytest.raises(ValueError, match="max_modify_size"):
        nve.NVEmbedding(ROWS, DIM, config={"max_modify_size": 0}, storage=storage, device="cpu")
    with pytest.raises(ValueError, match="cache_policy"):
        nve.NVEmbedding(ROWS, DIM, config={"cache_policy": "fifo"}, storage=storage, device="cpu")
    assert storage.name not in local_client.data_name_list()
    nve.NVEmbedding(
        ROWS,
        DIM,
        storage=storage,
        device="cpu",
        config={"kernel_mode": 1, "kernel_mode_value_1": 2, "kernel_mode_value_2": 3},
    )


def test_keys_must_be_on_the_layer_device(local_client: RecStoreClient) -> None:
    layer = nve.NVEmbedding(
        ROWS, DIM, storage=nve.RemoteTable(local_client, unique_name()), device="cpu"
    )
    with pytest.raises(ValueError, match="keys are on meta but the layer is on cpu"):
        layer(torch.tensor([1], device="meta"))
    with pytest.raises(IdDtypeError, match="Long, Int"):
        layer(torch.tensor([1.0]))
    with pytest.raises(IndexError, match=r"\[0, 1000\)"):
        layer(torch.tensor([1000]))


def test_hierarchical_needs_a_remote_table() -> None:
    with pytest.raises(TypeError, match=r"RemoteTable\(client, name\)"):
        nve.NVEmbedding(ROWS, DIM, layer_type=nve.LayerType.Hierarchical, device="cpu")


def test_an_existing_table_of_another_layout_is_refused(local_client: RecStoreClient) -> None:
    name = unique_name()
    local_client.init_data(name, (ROWS, DIM), torch.float32)
    with pytest.raises(Exception, match=r"exists|initialised"):
        nve.NVEmbedding(ROWS, DIM * 2, storage=nve.RemoteTable(local_client, name), device="cpu")


# -- training through the table's optimizer --------------------------------------------
@pytest.mark.parametrize("bag", [False, True])
def test_backward_updates_the_table_through_its_optimizer(
    any_client: RecStoreClient, bag: bool
) -> None:
    name = unique_name()
    weight = torch.randn(ROWS, DIM)
    cls = nve.NVEmbeddingBag if bag else nve.NVEmbedding
    layer = cls(
        ROWS,
        DIM,
        weight_init=weight,
        storage=nve.RemoteTable(any_client, name),
        device="cpu",
        config={"max_modify_size": 2},
    )
    keys = torch.tensor([[3, 5, 3], [9, 3, 1]])
    out = layer(keys)
    out.sum().backward()
    lr = any_client.learning_rate
    counts = torch.bincount(keys.reshape(-1), minlength=ROWS).unsqueeze(1).float()
    expected = weight - lr * counts
    got = any_client.pull(name, torch.arange(ROWS))
    torch.testing.assert_close(got, expected)


def test_gradient_updates_go_in_chunks_of_max_modify_size(
    local_client: RecStoreClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = nve.NVEmbedding(
        ROWS,
        DIM,
        storage=nve.RemoteTable(local_client, unique_name()),
        device="cpu",
        config={"max_modify_size": 2},
    )
    sizes: list[int] = []
    tables = local_client._for_modules
    original = tables.apply_gradients
    monkeypatch.setattr(
        tables,
        "apply_gradients",
        lambda updates: (sizes.extend(len(u[1]) for u in updates), original(updates))[1],
    )
    layer(torch.arange(5)).sum().backward()
    assert sizes == [2, 2, 1]


def test_training_reads_exact_rows_unless_staleness_is_allowed(
    any_client: RecStoreClient,
) -> None:
    name = unique_name()
    exact = nve.NVEmbedding(
        ROWS,
        DIM,
        storage=nve.RemoteTable(any_client, name),
        device="cpu",
        config={"host_cache_size": 1 << 16},
    )
    assert not exact.cache_stats()["enabled"]
    stale = nve.NVEmbedding(
        ROWS,
        DIM,
        storage=nve.RemoteTable(any_client, name),
        device="cpu",
        config={"host_cache_size": 1 << 16, "max_staleness_steps": 1},
    )
    keys = torch.tensor([4])
    rows = [stale(keys)]
    rows[0].sum().backward()  # step 1 read row 4, then updated it
    rows.append(stale(keys))  # step 2: the row read at step 1 (one step old)
    rows[1].sum().backward()
    rows.append(stale(keys))  # step 3: too old, read again: two updates in
    lr = any_client.learning_rate
    torch.testing.assert_close(rows[1], rows[0])
    torch.testing.assert_close(rows[2], rows[0] - 2 * lr)
    torch.testing.assert_close(exact(keys), rows[2])


# -- inference: exact through the table's version --------------------------------------
def test_inference_cache_sees_every_write(any_client: RecStoreClient) -> None:
    name = unique_name()
    any_client.init_data(name, (ROWS, DIM), torch.float32)
    layer = nve.NVEmbedding(
        ROWS,
        DIM,
        storage=nve.RemoteTable(any_client, name),
        device="cpu",
        optimize_for_training=False,
        config={"host_cache_size": 1 << 16},
    )
    keys = torch.tensor([1, 2, 600])
    layer(keys)
    layer(keys)
    assert layer.cache_stats()["hits"] == 3
    any_client.push(name, torch.tensor([600]), torch.full((1, DIM), 7.0))
    torch.testing.assert_close(layer(keys)[2], torch.full((DIM,), 7.0))
    assert layer.cache_stats()["invalidations"] == 1
    torch.testing.assert_close(layer(keys), any_client.pull(name, keys))


def test_logging_interval_logs_the_cache_line(
    local_client: RecStoreClient, caplog: pytest.LogCaptureFixture
) -> None:
    layer = nve.NVEmbedding(
        ROWS,
        DIM,
        storage=nve.RemoteTable(local_client, unique_name()),
        device="cpu",
        optimize_for_training=False,
        config={"host_cache_size": 1 << 16, "logging_interval": 2},
    )
    with caplog.at_level(logging.INFO, logger="recstore.nve"):
        for _ in range(4):
            layer(torch.tensor([1, 2]))
    lines = [r.getMessage() for r in caplog.records if r.name == "recstore.nve"]
    assert len(lines) == 2
    assert "lookups=4 hits=6 misses=2 hit_rate=0.7500" in lines[1]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_rows_come_back_exact_through_the_cache(
    any_client: RecStoreClient, dtype: torch.dtype
) -> None:
    name = unique_name()
    layer = nve.NVEmbedding(
        ROWS,
        DIM,
        dtype,
        storage=nve.RemoteTable(any_client, name),
        device="cpu",
        optimize_for_training=False,
        config={"host_cache_size": 1 << 16},
    )
    keys = torch.tensor([[5, 9], [9, 700]])
    first, second = layer(keys), layer(keys)
    expected = any_client.pull(name, keys.reshape(-1)).view(2, 2, DIM)
    assert first.dtype == dtype
    torch.testing.assert_close(first, expected, rtol=0, atol=0)
    torch.testing.assert_close(second, expected, rtol=0, atol=0)
    assert layer.cache_stats()["hits"] == 3


def test_cache_counters_are_exported_to_prometheus(local_client: RecStoreClient) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    nve.register_cache_metrics(registry)
    name = unique_name()
    layer = nve.NVEmbedding(
        ROWS,
        DIM,
        storage=nve.RemoteTable(local_client, name),
        device="cpu",
        optimize_for_training=False,
        config={"host_cache_size": 1 << 16},
    )
    layer(torch.tensor([1, 2]))
    layer(torch.tensor([1, 3]))
    labels = {"table": name, "layer": layer.name, "tier": "host"}
    assert registry.get_sample_value("recstore_nve_cache_hits_total", labels) == 1
    assert registry.get_sample_value("recstore_nve_cache_misses_total", labels) == 3
    assert registry.get_sample_value("recstore_nve_cache_hit_rate", labels) == 0.25
    used = registry.get_sample_value("recstore_nve_cache_bytes_used", labels)
    assert used == layer.cache_stats()["bytes_used"] > 0


# -- torch.compile and torch.export ----------------------------------------------------
class _NVEModel(torch.nn.Module):
    """An embedding, a bag with a host cache and a collection of two bags, a dense head."""

    def __init__(self, client: RecStoreClient, weight: torch.Tensor) -> None:
        super().__init__()

        def layer(cls, **options):
            table = nve.RemoteTable(client, unique_name("nvc"))
            return cls(ROWS, DIM, weight_init=weight, storage=table, device="cpu", **options)

        self.user = layer(nve.NVEmbedding)
        self.items = layer(nve.NVEmbeddingBag, mode="mean",
                           config={"host_cache_size": 1 << 14})  # fmt: skip
        self.pair = nve.NVEmbeddingBagCollection([layer(nve.NVEmbeddingBag) for _ in range(2)])
        torch.manual_seed(0)
        self.head = torch.nn.Linear(4 * DIM, 1)

    def forward(self, user: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        parts = [self.user(user), self.items(items), *self.pair([items, items.flip(1)])]
        return self.head(torch.cat(parts, 1)).pow(2).mean()

    def tables(self) -> list[str]:
        bags = [self.user, self.items, *self.pair.layers]
        return [layer.storage.name for layer in bags]  # type: ignore[union-attr]


def test_compiled_models_with_layers_train_as_in_eager(any_client: RecStoreClient) -> None:
    """torch.compile runs the layers outside its graph: same losses and rows as eager."""
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(4))
    eager, compiled = _NVEModel(any_client, weight), _NVEModel(any_client, weight)
    run = torch.compile(compiled, backend="aot_eager")
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        user, items = torch.randint(0, ROWS, (6,), generator=g), torch.randint(0, 50, (6, 3))
        expected, got = eager(user, items), run(user, items)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        expected.backward()
        got.backward()
    everything = torch.arange(ROWS)
    for a, b in zip(compiled.tables(), eager.tables(), strict=True):
        torch.testing.assert_close(any_client.pull(a, everything), any_client.pull(b, everything))
    assert not torch.equal(any_client.pull(eager.tables()[0], everything), weight)


class _Ranker(torch.nn.Module):
    """Scores per sample from an embedding behind a host cache, a bag with offsets, a
    collection (sum and max bags) and a recstore.nn bag."""

    def __init__(self, client: RecStoreClient) -> None:
        super().__init__()

        def layer(cls, **options):
            table = nve.RemoteTable(client, unique_name("nve"))
            return cls(ROWS, DIM, weight_init=torch.randn(ROWS, DIM), storage=table,
                       device="cpu", **options)  # fmt: skip

        self.user = layer(nve.NVEmbedding, optimize_for_training=False,
                          config={"host_cache_size": 1 << 12})  # fmt: skip
        self.items = layer(nve.NVEmbeddingBag, mode="mean")
        self.pair = nve.NVEmbeddingBagCollection(
            [layer(nve.NVEmbeddingBag), layer(nve.NVEmbeddingBag, mode="max")]
        )
        self.plain = rnn.EmbeddingBag(ROWS, DIM, client=client, name=unique_name("nvr"))
        self.head = torch.nn.Linear(5 * DIM, 1)

    def forward(self, user, items, offsets, grid):
        pooled = self.pair([grid, (items, offsets)])
        parts = [self.user(user), self.items(items, offsets), *pooled, self.plain(grid)]
        return self.head(torch.cat(parts, 1)).squeeze(1)


def _ranker_batch(size: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(size)
    lengths = torch.randint(0, 4, (size,), generator=g)  # some bags empty
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    items = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    return (
        torch.randint(0, ROWS, (size,), generator=g),
        items,
        offsets,
        torch.randint(0, ROWS, (size, 3), generator=g),
    )


@pytest.mark.parametrize("aoti", [False, True], ids=["program", "aoti"])
def test_a_model_with_layers_exports_and_serves_as_in_eager(
    local_client: RecStoreClient, tmp_path, aoti: bool
) -> None:
    """recstore.export packages the layers' tables; one package serves every batch size."""
    model = _Ranker(local_client)
    batch, ids = Dim("batch", min=1, max=4096), Dim("ids", min=0, max=1 << 20)
    path = export.save(model, _ranker_batch(8), tmp_path / "pkg", aoti=aoti,
                       dynamic_shapes=({0: batch}, {0: ids}, {0: batch}, {0: batch}))  # fmt: skip
    assert len(list((tmp_path / "pkg" / "tables").iterdir())) == 5
    served = export.load(path, aoti=aoti)
    try:
        for size in (8, 1, 5, 40):
            with torch.no_grad():
                want = model(*_ranker_batch(size))
            torch.testing.assert_close(served(*_ranker_batch(size)), want, atol=1e-6, rtol=0)
    finally:
        served.close()


def test_a_layer_without_a_recstore_table_is_refused_at_export(
    local_client: RecStoreClient, tmp_path
) -> None:
    class Host(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.host = nve.NVEmbedding(ROWS, DIM, layer_type=nve.LayerType.HostLayer,
                                        device="cpu", optimize_for_training=False)  # fmt: skip
            table = nve.RemoteTable(local_client, unique_name("nvh"))
            self.table = nve.NVEmbedding(ROWS, DIM, storage=table, device="cpu")

        def forward(self, keys):
            return self.host(keys) + self.table(keys)

    with pytest.raises(RuntimeError, match="HostLayer cannot be exported"):
        export.save(Host(), (torch.tensor([1, 2]),), tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()  # no half-written package


# -- state_dict and DCP ----------------------------------------------------------------
def _layer_of_kind(kind: str, client: RecStoreClient) -> nve.NVEmbedding:
    if kind == "host":
        return nve.NVEmbedding(ROWS, DIM, layer_type=nve.LayerType.HostLayer, device="cpu",
                               optimize_for_training=False)  # fmt: skip
    configs = {
        "table": None,
        "cached": {"host_cache_size": 1 << 14},  # inference: versions checked
        "stale": {"host_cache_size": 1 << 14, "max_staleness_steps": 3},  # training
    }
    return nve.NVEmbedding(ROWS, DIM, storage=nve.RemoteTable(client, unique_name("nvs")),
                           device="cpu", config=configs[kind],
                           optimize_for_training=kind != "cached")  # fmt: skip


@pytest.mark.parametrize("kind", ["table", "cached", "stale", "host"])
def test_layers_carry_their_rows_through_state_dict_and_dcp(
    local_client: RecStoreClient, kind: str, tmp_path
) -> None:
    """A torch.nn.Embedding checkpoint loads into an NVE layer (and back): state_dict,
    recstore.client.checkpoint (DCP in row blocks), and for host rows the reference's
    ``dcp.load`` into ``layer.weight``; a wrong shape is refused and changes nothing."""
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(8))
    reference = torch.nn.Embedding(ROWS, DIM, _weight=weight.clone())
    keys = torch.tensor([0, 7, ROWS - 1])

    layer = _layer_of_kind(kind, local_client)
    layer(keys)  # a cached layer now holds rows the load replaces
    assert list(layer.state_dict()) == ["weight"]
    layer.load_state_dict(reference.state_dict())
    torch.testing.assert_close(layer(keys), weight[keys])
    torch.testing.assert_close(layer.state_dict()["weight"], weight)

    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        layer.load_state_dict({"weight": torch.zeros(ROWS + 1, DIM)})
    torch.testing.assert_close(layer.weight, weight)

    dcp.save(reference.state_dict(), checkpoint_id=tmp_path / "torch")
    loaded = _layer_of_kind(kind, local_client)
    checkpoint.load(loaded, tmp_path / "torch")
    torch.testing.assert_close(loaded(keys), weight[keys])
    checkpoint.save(loaded, tmp_path / "nve")
    back = torch.nn.Embedding(ROWS, DIM)
    state = back.state_dict()
    dcp.load(state, checkpoint_id=tmp_path / "nve")
    torch.testing.assert_close(state["weight"], weight)

    if kind == "host":  # the reference's way: dcp.load straight into the layer's weight
        fresh = _layer_of_kind(kind, local_client)
        dcp.load({"weight": fresh.weight}, checkpoint_id=tmp_path / "torch")
        torch.testing.assert_close(fresh(keys), weight[keys])


def test_a_training_layer_saves_its_optimizer_state_when_asked(local_client) -> None:
    table = nve.RemoteTable(local_client, unique_name("nvo"), optimizer={"kind": "adagrad"})
    layer = nve.NVEmbedding(ROWS, DIM, storage=table, device="cpu")
    layer(torch.tensor([1, 2])).sum().backward()
    with rnn_optimizer_state(layer):
        state = layer.state_dict()
    assert list(state) == ["weight", "optimizer.sum"]
    assert state["optimizer.sum"][1].abs().sum() > 0 and state["optimizer.sum"][3].sum() == 0


@pytest.mark.parametrize("kind", ["table", "host"])
def test_converting_a_layers_dtype_raises_clearly(local_client: RecStoreClient, kind) -> None:
    """``model.half()`` cannot convert rows kept in a table or a memory block: refused,
    as for recstore.nn modules, never silently ignored; same-dtype and device moves work."""
    layer = _layer_of_kind(kind, local_client)
    before = layer.weight.clone()
    for convert in (lambda m: m.half(), lambda m: torch.nn.Sequential(m).to(torch.float64)):
        with pytest.raises(TypeError, match=r"Create the layer with data_type=torch\.float"):
            convert(layer)
    torch.testing.assert_close(layer.weight, before)
    assert layer.to("cpu", torch.float32).float() is layer
    assert layer(torch.tensor([3])).dtype == torch.float32


def test_requires_grad_freezes_and_unfreezes_a_layer(any_client: RecStoreClient) -> None:
    """torch's way to freeze a module reaches the table, alone and inside a collection."""

    def bag() -> nve.NVEmbeddingBag:
        table = nve.RemoteTable(any_client, unique_name("nvf"))
        return nve.NVEmbeddingBag(ROWS, DIM, weight_init=torch.randn(ROWS, DIM), storage=table,
                                  device="cpu")  # fmt: skip

    keys = torch.tensor([[1, 2], [3, 1]])
    layer = bag()
    before = layer.weight.clone()
    assert layer.requires_grad_(False) is layer and layer.frozen
    out = layer(keys)
    assert not out.requires_grad  # as a frozen torch.nn.EmbeddingBag's output
    torch.testing.assert_close(layer.weight, before)
    layer.requires_grad_(True)
    layer(keys).sum().backward()
    assert not torch.equal(layer.weight, before)

    frozen, trained = bag(), bag()
    frozen.requires_grad_(False)
    rows = [frozen.weight.clone(), trained.weight.clone()]
    pair = nve.NVEmbeddingBagCollection([frozen, trained])
    sum(out.sum() for out in pair([keys, keys])).backward()
    torch.testing.assert_close(frozen.weight, rows[0])
    assert not torch.equal(trained.weight, rows[1])

    serving = nve.NVEmbedding(ROWS, DIM, storage=nve.RemoteTable(any_client, unique_name("nvi")),
                              device="cpu", optimize_for_training=False)  # fmt: skip
    with pytest.raises(ValueError, match="opened as an inference table"):
        serving.requires_grad_(True)
    assert not serving.frozen
