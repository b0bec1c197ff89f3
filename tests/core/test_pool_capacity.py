"""A pool's capacity arithmetic: the engine's own reservation per node, summed in order."""

from __future__ import annotations

import pytest

from recstore.core.errors import InvalidArgument
from recstore.core.pool import PoolSpec, parse_pool
from recstore.core.pool_capacity import NODE_BYTES, Footprint, admit, footprint, quantity_bytes
from recstore.core.reconcile import parse_declaration
from recstore.core.spec import TableSpec
from recstore.store import Table

MiB = 2**20


@pytest.mark.parametrize(
    ("quantity", "size"),
    [("1Gi", 2**30), ("512Mi", 512 * MiB), ("1.5Gi", 3 * 2**29), ("2G", 2 * 10**9),
     ("100", 100), ("1500m", 1)],
)  # fmt: skip
def test_quantity_bytes(quantity: str, size: int) -> None:
    assert quantity_bytes(quantity) == size


@pytest.mark.parametrize(
    ("fields", "shards"),
    [
        ({}, 1),  # dense, one shard: direct addressing
        ({}, 3),  # dense over 3 nodes: a hash index
        ({"optimizer": {"kind": "adam"}}, 2),
        ({"keys": {"mode": "hashed", "capacity": 5000, "eviction": "lru"}}, 2),
        ({"mode": "inference", "dtype": "float16"}, 2),
    ],
)
def test_a_hosts_footprint_is_the_engines_own_reservation(fields: dict, shards: int) -> None:
    spec = TableSpec(name="t", num_embeddings=20000, embedding_dim=8, shards=shards, **fields)
    table = Table(spec, shard_index=0, num_shards=shards)
    assert footprint(spec, shards) == Footprint(host=table.memory_bytes)


def test_gpu_tiers_reserve_gpu_memory() -> None:
    cached = TableSpec(name="t", num_embeddings=1000, embedding_dim=4, storage="gpu_cache",
                       gpu_cache={"bytes": 64000})  # fmt: skip
    assert footprint(cached, 2).gpu == 32000 and footprint(cached, 2).host > 0
    on_gpu = TableSpec(name="t", num_embeddings=1000, embedding_dim=4, storage="gpu")
    assert footprint(on_gpu, 1).host == 0 and footprint(on_gpu, 1).gpu > 0


def _pool(memory: str, **extra: object) -> PoolSpec:
    return PoolSpec.model_validate({"placement": {"resources": {"memory": memory}}, **extra})


def test_tables_are_placed_in_order_while_they_fit() -> None:
    small = TableSpec(name="s", num_embeddings=100_000, embedding_dim=16)  # ~6.4 MiB a node
    per_node = footprint(small, 2).host
    pool = _pool(f"{(NODE_BYTES + 2 * per_node + per_node // 2) // MiB + 1}Mi")
    admission = admit("p", pool, [("a", small), ("b", small), ("c", small), ("d", small)], 2)
    assert list(admission.placed) == ["a", "b"]
    assert admission.reserved.host == 2 * per_node
    assert set(admission.refused) == {"c", "d"}
    message = admission.refused["c"]
    assert (
        "table 'c' needs" in message and "pool 'p'" in message and "on each of 2 nodes" in message
    )


def test_gpu_memory_is_checked_where_the_pool_declares_it() -> None:
    on_gpu = TableSpec(name="g", num_embeddings=1_000_000, embedding_dim=64, storage="gpu")
    pool = _pool("64Gi", placement={"gpus": 1, "resources": {"memory": "64Gi"}}, gpuMemory="100Mi")
    admission = admit("p", pool, [("g", on_gpu)], 1)
    assert "GPU memory" in admission.refused["g"] and "gpuMemory 100Mi" in admission.refused["g"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"shards": 0}, "spec.shards"),
        ({"gpuMemory": "80Gi"}, "gpuMemory applies to a pool with placement.gpus >= 1"),
        ({"placement": {"spread": "sometimes"}}, "spec.placement.spread"),
        ({"tables": []}, "spec.tables"),
    ],
)
def test_a_bad_pool_is_refused_naming_the_field(spec: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace(".", r"\.")):
        parse_pool(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"pool": "p", "shards": 2}, "spec.shards: a table on pool 'p'"),
        ({"pool": "p", "placement": {}}, "spec.placement: a table on pool 'p'"),
        ({"pool": "P_1"}, "spec.pool: 'P_1' is not the name of an EmbeddingPool"),
    ],
)
def test_a_table_on_a_pool_declares_no_fleet_of_its_own(spec: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_declaration({"numEmbeddings": 10, "embeddingDim": 4, **spec}, default_name="t")
    placed = parse_declaration(
        {"numEmbeddings": 10, "embeddingDim": 4, "pool": "p"}, default_name="t"
    )
    assert placed.pool == "p"
