"""recstore.export: a model with RecStore embeddings saved, loaded and served as in eager."""

from __future__ import annotations

import json

import pytest
import torch
from torch.export import Dim

from recstore import RecStoreClient, export
from recstore import nn as rnn
from recstore.client.errors import BackendError
from recstore.client.remote.backend import PS_TOKEN_ENV
from recstore.ps.serve.server import start_in_thread

from .conftest import unique_name

NUM, DIM = 40, 4


class Ranker(torch.nn.Module):
    def __init__(self, client) -> None:
        super().__init__()

        def table(cls, seed, **options):
            weights = torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(seed))
            return cls(NUM, DIM, _weight=weights, client=client, name=unique_name("x"), **options)

        self.user = table(rnn.Embedding, 1, padding_idx=0)
        self.items = table(rnn.EmbeddingBag, 2, mode="mean")
        self.collection = rnn.EmbeddingBagCollection(
            [table(rnn.EmbeddingBag, 3, mode="sum"), table(rnn.EmbeddingBag, 4, mode="max")]
        )
        torch.manual_seed(0)
        self.head = torch.nn.Linear(4 * DIM, 1)

    def forward(self, user, items, offsets, grid):
        pooled = self.collection([grid, (items, offsets)])
        features = [self.user(user), self.items(items, offsets), *pooled]
        return self.head(torch.cat(features, dim=1)).squeeze(1)


def _batch(size: int, seed: int) -> tuple[torch.Tensor, ...]:
    """``size`` samples with 0-3 items each (some bags empty)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (size,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    items = torch.randint(0, NUM, (int(lengths.sum()),), generator=g)
    user = torch.randint(0, NUM, (size,), generator=g)
    return user, items, offsets, torch.randint(0, NUM, (size, 2), generator=g)


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(0, NUM, (10,), generator=g)
    return (
        torch.randint(0, NUM, (3,), generator=g),
        items,
        torch.tensor([0, 4, 4]),
        torch.randint(0, NUM, (3, 2), generator=g),
    )


def test_packaged_model_serves_eager_outputs_from_its_own_rows(local_client, tmp_path) -> None:
    model = Ranker(local_client)
    path = export.save(model, _inputs(0), tmp_path / "pkg")
    metadata = json.loads((path / "metadata.json").read_text())
    assert (path / "model.pt2").is_file()
    assert {t["source"] for t in metadata["tables"]} == {"rows"}
    assert all((path / t["rows_file"]).is_file() for t in metadata["tables"])
    with torch.no_grad():
        expected = [model(*_inputs(seed)) for seed in (1, 2)]
    served = export.load(path)
    try:
        for seed, want in zip((1, 2), expected, strict=True):
            torch.testing.assert_close(served(*_inputs(seed)), want, atol=1e-6, rtol=0)
        # the package holds a snapshot: training the live tables afterwards changes nothing
        model(*_inputs(1)).sum().backward()
        torch.testing.assert_close(served(*_inputs(1)), expected[0], atol=1e-6, rtol=0)
        handle = metadata["tables"][0]["handle"]
        with pytest.raises(RuntimeError, match="read-only serving copy"):
            torch.ops.recstore.emb_update_table(handle, torch.tensor([1]), torch.ones(1, DIM))
    finally:
        served.close()


def test_live_table_reference_reads_the_table_as_it_is_now(grpc_client, ps_endpoints, tmp_path):
    model = Ranker(grpc_client)
    live = {model.items.table_name: ",".join(ps_endpoints)}
    path = export.save(model, _inputs(0), tmp_path / "pkg", live=live)
    entries = {t["name"]: t for t in json.loads((path / "metadata.json").read_text())["tables"]}
    assert entries[model.items.table_name]["source"] == "live"
    assert "rows_file" not in entries[model.items.table_name]
    assert not (path / "tables" / f"{model.items.table_name}.pt").exists()
    served = export.load(path)
    try:
        with torch.no_grad():
            torch.testing.assert_close(served(*_inputs(1)), model(*_inputs(1)), atol=1e-6, rtol=0)
            grpc_client.push(model.items.table_name, torch.arange(NUM), torch.zeros(NUM, DIM))
            torch.testing.assert_close(served(*_inputs(1)), model(*_inputs(1)), atol=1e-6, rtol=0)
    finally:
        served.close()


def test_bad_packages_and_arguments_are_refused(local_client, tmp_path) -> None:
    model = Ranker(local_client)
    with pytest.raises(ValueError, match="not tables of this model"):
        export.save(model, _inputs(0), tmp_path / "bad", live={"nope": "127.0.0.1:1"})
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match=r"no recstore\.nn embedding module"):
        export.save(torch.nn.Linear(2, 2), (torch.ones(1, 2),), tmp_path / "none")
    path = export.save(model, _inputs(0), tmp_path / "pkg")
    with pytest.raises(ValueError, match="no AOTInductor package"):
        export.load(path, aoti=True)
    (path / "metadata.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="unknown package format"):
        export.load(path)


def test_aoti_package_loads_and_serves_eager_outputs(local_client, tmp_path) -> None:
    """AOTInductor: the program compiled to a shared library; the lookups call the ops."""

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag = rnn.EmbeddingBag(NUM, DIM, mode="sum", client=local_client,
                                        name=unique_name("a"))  # fmt: skip
            self.head = torch.nn.Linear(DIM, 1)

        def forward(self, grid):
            return self.head(self.bag(grid))

    model = Small()
    grid = torch.randint(0, NUM, (5, 3))
    path = export.save(model, (grid,), tmp_path / "pkg", aoti=True)
    served = export.load(path, aoti=True)
    try:
        other = torch.randint(0, NUM, (5, 3))
        with torch.no_grad():
            torch.testing.assert_close(served(other), model(other), atol=1e-6, rtol=0)
    finally:
        served.close()


@pytest.mark.parametrize("aoti", [False, True], ids=["program", "aoti"])
def test_a_dynamic_batch_dimension_serves_every_batch_size(local_client, tmp_path, aoti) -> None:
    """Exported with the batch size symbolic, one package serves batches of any size."""
    model = Ranker(local_client)
    batch, items = Dim("batch", min=1, max=4096), Dim("items", min=0, max=1 << 20)
    shapes = ({0: batch}, {0: items}, {0: batch}, {0: batch})
    path = export.save(model, _batch(8, 0), tmp_path / "pkg", dynamic_shapes=shapes, aoti=aoti)
    served = export.load(path, aoti=aoti)
    try:
        for size in (8, 1, 2, 5, 100):
            inputs = _batch(size, size)
            with torch.no_grad():
                want = model(*inputs)
            got = served(*inputs)
            assert got.shape == (size,)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    finally:
        served.close()


def test_a_server_holding_only_the_read_only_token_serves_live_tables(
    tmp_path, monkeypatch
) -> None:
    """Serving replicas get the nodes' read-only token: they open the live table
    (never create one) and read it; a table that does not exist stays refused."""
    writer, reader = "writer-s3cret", "reader-s3cret"
    node = start_in_thread("127.0.0.1", 0, data_dir=tmp_path / "node", auth_token=writer,
                           read_only_token=reader)  # fmt: skip
    try:
        monkeypatch.setenv(PS_TOKEN_ENV, writer)
        trainer = RecStoreClient(role=unique_name("trainer"))
        trainer.set_ps_endpoints(node.address)
        model = Ranker(trainer)
        path = export.save(model, _inputs(0), tmp_path / "pkg",
                           live={model.items.table_name: node.address})  # fmt: skip
        monkeypatch.setenv(PS_TOKEN_ENV, reader)
        served = export.load(path)
        try:
            with torch.no_grad():
                torch.testing.assert_close(
                    served(*_inputs(1)), model(*_inputs(1)), atol=1e-6, rtol=0
                )
        finally:
            served.close()
        stranger = RecStoreClient(role=unique_name("reader"))
        stranger.set_ps_endpoints(node.address)
        with pytest.raises(BackendError, match="PERMISSION_DENIED"):
            stranger.init_data("absent", (NUM, DIM), torch.float32)
        assert trainer._backend().describe("absent") is None
        stranger.close()
        trainer.close()
    finally:
        node.stop()
