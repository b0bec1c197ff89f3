"""Sharded gRPC: keys land on their owner shard, adam reaches every shard, admin discovery."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import torch

from recstore.client import RecStoreClient
from recstore.core import Optimizer, SlotMap, TableSpec
from recstore.v1 import ps_pb2, ps_pb2_grpc

from .conftest import unique_name


def _shard_sizes(endpoints: list[str], name: str) -> list[int]:
    sizes = []
    for endpoint in endpoints:
        with grpc.insecure_channel(endpoint) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            sizes.append(stub.GetTableStats(ps_pb2.GetTableStatsRequest(table=name)).size)
    return sizes


def test_rows_live_on_their_owner_shard(grpc_client, ps_endpoints) -> None:
    name = unique_name()
    grpc_client.init_data(name, (1000, 4), torch.float32)
    ids = torch.arange(0, 1000, 3)
    grpc_client.pull(name, ids)  # creates exactly these rows, each on its owner
    owners = SlotMap.initial(2).shard_of(ids.numpy())
    assert _shard_sizes(ps_endpoints, name) == [int((owners == 0).sum()), int((owners == 1).sum())]


def test_big_batches_are_split_and_reassembled(grpc_client) -> None:
    name = unique_name()
    weights = torch.randn(5000, 8)
    grpc_client.init_data(name, (5000, 8), torch.float32, init_func=lambda s, d: weights.clone())
    grpc_client.ops._max_batch_bytes = 8 * 4 * 100  # 100 rows per request
    grpc_client.ops._tables.clear()  # re-plan with the small batches
    ids = torch.randint(0, 5000, (3000,))
    torch.testing.assert_close(grpc_client.pull(name, ids), weights[ids])


def test_adam_steps_every_shard_once_per_update(grpc_client) -> None:
    """SparseAdam semantics: the per-table step count advances on every shard every step."""
    name = unique_name()
    weights = torch.randn(300, 4)
    grpc_client.init_data(
        name, (300, 4), torch.float32, init_func=lambda s, d: weights.clone(),
        optimizer={"kind": "adam", "lr": 0.01},
    )  # fmt: skip
    reference = torch.nn.Parameter(weights.clone())
    optimizer = torch.optim.SparseAdam([reference], lr=0.01)
    owners = SlotMap.initial(2).shard_of(torch.arange(300).numpy())
    shard0 = torch.nonzero(torch.from_numpy(owners == 0))[:, 0]
    shard1 = torch.nonzero(torch.from_numpy(owners == 1))[:, 0]
    batches = [shard0[:5], shard0[5:9], shard1[:3], torch.cat([shard0[:2], shard1[3:6]])]
    for step, ids in enumerate(batches):  # some steps touch only one shard
        grads = torch.randn(len(ids), 4, generator=torch.Generator().manual_seed(step))
        grpc_client.update(name, ids, grads)
        optimizer.zero_grad()
        reference.grad = torch.sparse_coo_tensor(
            ids.unsqueeze(0), grads, (300, 4), check_invariants=True
        )
        optimizer.step()
    torch.testing.assert_close(
        grpc_client.pull(name, torch.arange(300)), reference.detach(), atol=1e-5, rtol=0
    )


#: the fake admin API's catalogue: table name -> discovery document
_DOCUMENTS: dict[str, dict[str, Any]] = {}
_TOKEN = "s3cret"


@pytest.fixture
def admin_url(fake_http: Any) -> str:
    """A fake admin API answering discovery of the tables in ``_DOCUMENTS`` to ``_TOKEN``."""

    def discovery(request: Any) -> Any:
        name = request.path.removeprefix("/api/v1/tables/").removesuffix("/discovery")
        if request.headers.get("Authorization") != f"Bearer {_TOKEN}":
            return fake_http.json(401, {"detail": "missing or wrong token"})
        if name in _DOCUMENTS:
            return fake_http.json(200, _DOCUMENTS[name])
        return fake_http.json(404, {"detail": f"table {name} not found"})

    return str(fake_http(discovery).url)


def test_discovery_through_the_admin_api(admin_url, ps_endpoints, monkeypatch) -> None:
    name = unique_name()
    spec = TableSpec(name=name, num_embeddings=100, embedding_dim=4, shards=2,
                     optimizer=Optimizer(kind="sgd", lr=0.1))  # fmt: skip
    _DOCUMENTS[name] = {
        "name": name, "spec": spec.to_wire(), "dtype": "float32", "embedding_dim": 4,
        "num_embeddings": 100, "shards": 2, "slot_map": SlotMap.initial(2).to_dict(),
        "endpoints": ps_endpoints,
    }  # fmt: skip
    monkeypatch.setenv("RECSTORE_ADMIN_URL", admin_url)
    monkeypatch.setenv("RECSTORE_TOKEN", _TOKEN)
    monkeypatch.delenv("RECSTORE_PS_ENDPOINTS", raising=False)
    client = RecStoreClient(role=unique_name("role"))
    try:
        assert client.backend == "grpc"
        with pytest.raises(TypeError):
            client.init_data(name, (100, 8), torch.float32)  # the catalogue says dim 4
        client.init_data(name, (100, 4), torch.float32, init_func=lambda s, d: torch.ones(s))
        client.update(name, torch.tensor([1, 99]), torch.ones(2, 4))
        torch.testing.assert_close(client.pull(name, torch.tensor([1, 2])),
                                   torch.tensor([[0.9] * 4, [1.0] * 4]))  # fmt: skip
        with pytest.raises(RuntimeError, match="not in the admin API catalogue"):
            client.init_data(unique_name(), (10, 4), torch.float32)
        client.delete_data(name)
        assert _shard_sizes_or_missing(ps_endpoints, name)
    finally:
        client.close()


def _shard_sizes_or_missing(endpoints: list[str], name: str) -> bool:
    with pytest.raises(grpc.RpcError) as error:
        _shard_sizes(endpoints, name)
    return error.value.code() == grpc.StatusCode.NOT_FOUND


def test_wrong_admin_token_is_a_runtime_error(admin_url) -> None:
    client = RecStoreClient(role=unique_name("role"))
    try:
        client.set_admin_url(admin_url, token="wrong")
        with pytest.raises(RuntimeError, match="HTTP 401"):
            client.init_data(unique_name(), (10, 4), torch.float32)
    finally:
        client.close()


def test_endpoints_out_of_shard_order_are_refused(ps_endpoints) -> None:
    client = RecStoreClient(role=unique_name("role"))
    try:
        client.set_ps_endpoints(list(reversed(ps_endpoints)))
        with pytest.raises(RuntimeError, match="shard order"):
            client.init_data(unique_name(), (10, 4), torch.float32)
    finally:
        client.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ids_come_back_on_the_device(any_client) -> None:
    name = unique_name()
    weights = torch.randn(50, 4)
    any_client.init_data(name, (50, 4), torch.float32, init_func=lambda s, d: weights.clone())
    ids = torch.tensor([3, 1, 3], device="cuda", dtype=torch.int32)
    rows = any_client.pull(name, ids)
    assert rows.device.type == "cuda"
    torch.testing.assert_close(rows.cpu(), weights[[3, 1, 3]])
    any_client.update(name, ids, torch.ones(3, 4, device="cuda"))
    prefetch_id = any_client.prefetch(ids, name=name)
    fetched = any_client.wait_for_prefetch(prefetch_id, timeout=10)
    assert fetched.device.type == "cuda"
    torch.testing.assert_close(fetched.cpu()[1], weights[1] - 0.01)
