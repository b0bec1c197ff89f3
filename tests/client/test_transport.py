"""16-bit transport of float32 tables: half the bytes on the wire, float32 on the node."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from recstore.client import RecStoreClient
from recstore.core import SlotMap, wire

from .conftest import unique_name


def _weights(rows: int, dim: int) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(rows + dim))


def _table(client: RecStoreClient, rows: int = 400, dim: int = 8, **metadata: object) -> str:
    name = unique_name()
    weights = _weights(rows, dim)
    client.init_data(
        name, (rows, dim), torch.float32, init_func=lambda s, d: weights.clone(),
        metadata=metadata or None,
    )  # fmt: skip
    return name


@pytest.fixture
def exact_client(ps_endpoints: list[str]) -> RecStoreClient:
    """A second client on the same nodes, pulling in float32."""
    client = RecStoreClient(role=unique_name("exact"))
    client.set_ps_endpoints(ps_endpoints)
    yield client
    client.close()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rows_travel_in_16_bits_and_arrive_rounded_to_nearest_even(
    grpc_client: RecStoreClient, exact_client: RecStoreClient, dtype: str
) -> None:
    name = _table(grpc_client)
    grpc_client.set_transport_dtype(dtype)
    ids = torch.arange(0, 400, 3)
    narrow = getattr(torch, dtype)
    weights = _weights(400, 8)
    torch.testing.assert_close(
        grpc_client.pull(name, ids), weights[ids].to(narrow).float(), atol=0, rtol=0
    )
    (many,) = grpc_client.ops.pull_many(
        [(name, ids, False)]
    )  # the multi-table path rounds the same
    torch.testing.assert_close(many, weights[ids].to(narrow).float(), atol=0, rtol=0)
    # the node keeps float32 rows: a float32 client reads them exactly
    torch.testing.assert_close(exact_client.ops.pull(name, ids), weights[ids], atol=0, rtol=0)


@pytest.mark.parametrize("multi", [False, True], ids=["update", "update_many"])
def test_16_bit_gradients_run_the_optimizer_in_float32_on_the_node(
    grpc_client: RecStoreClient, exact_client: RecStoreClient, multi: bool
) -> None:
    name = _table(grpc_client, optimizer={"kind": "sgd", "lr": 0.5})
    grpc_client.set_transport_dtype("bfloat16")
    ids = torch.tensor([5, 7, 399, 0])
    grads = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    if multi:
        grpc_client.ops.update_many([(name, ids, grads, None)])
    else:
        grpc_client.update(name, ids, grads)
    grpc_client.flush()
    expected = _weights(400, 8)
    expected[ids] -= 0.5 * grads.to(torch.bfloat16).float()
    torch.testing.assert_close(exact_client.ops.pull(name, torch.arange(400)), expected)


def test_a_table_spec_picks_its_transport(
    grpc_client: RecStoreClient, exact_client: RecStoreClient
) -> None:
    name = _table(grpc_client, transport_dtype="bfloat16")
    ids = torch.arange(0, 400, 7)
    weights = _weights(400, 8)
    expected = weights[ids].to(torch.bfloat16).float()
    torch.testing.assert_close(exact_client.ops.pull(name, ids), expected, atol=0, rtol=0)
    assert exact_client.ops.describe(name).transport_dtype == "bfloat16"


def test_a_16_bit_table_keeps_its_own_dtype_on_the_wire(grpc_client: RecStoreClient) -> None:
    name = unique_name()
    grpc_client.init_data(name, (50, 4), torch.float16)
    grpc_client.set_transport_dtype("bfloat16")  # applies to float32 tables only
    assert grpc_client.pull(name, torch.arange(10)).dtype == torch.float16


def test_the_node_refuses_a_transport_the_table_does_not_allow(
    grpc_client: RecStoreClient, ps_endpoints: list[str]
) -> None:
    name = unique_name()
    grpc_client.init_data(name, (50, 4), torch.float16)
    owner = ps_endpoints[int(SlotMap.initial(2).shard_of(np.array([3]))[0])]
    with grpc.insecure_channel(owner) as channel:
        client = wire.WireClient(channel)
        with pytest.raises(grpc.RpcError) as pulled:
            client.pull(name, [3], value_dtype="bfloat16")
        assert pulled.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "value_dtype 'bfloat16' must be the table dtype 'float16'" in pulled.value.details()
        with pytest.raises(grpc.RpcError) as multi:
            client.multi_pull([(name, [3])], value_dtype="bfloat16")
        assert multi.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "value_dtype 'bfloat16' must be the table dtype 'float16'" in multi.value.details()
    assert grpc_client.pull(name, torch.tensor([3])).dtype == torch.float16


def test_the_demo_model_trains_as_well_with_bfloat16_transport(
    grpc_client: RecStoreClient, ps_endpoints: list[str]
) -> None:
    """The DLRM example, one collection over 2 nodes: bfloat16 transport against float32."""
    examples = str(Path(__file__).resolve().parents[2] / "examples")
    sys.path.insert(0, examples)
    try:
        import dlrm_synthetic as dlrm
    finally:
        sys.path.remove(examples)
    config = dlrm.DataConfig(num_features=3, cardinality=2000, batch_size=128, seed=5)
    final = {}
    for transport in (None, "bfloat16"):
        grpc_client.set_transport_dtype(transport)
        torch.manual_seed(0)
        model = dlrm.DLRM(config, 8, dlrm.recstore_bags(grpc_client, lr=0.5), collection=True)
        losses = dlrm.train(model, dlrm.SyntheticClicks(config), steps=80, lr=0.5, progress=False)
        final[transport] = sum(losses[-20:]) / 20
        assert final[transport] < sum(losses[:20]) / 20  # it learns
    assert final["bfloat16"] == pytest.approx(final[None], rel=0.01)
    assert final["bfloat16"] != final[None]  # the rows did travel rounded
