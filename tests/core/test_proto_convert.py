"""Proto <-> core conversions: round trips, unset fields, and the clear errors for bad input."""

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from recstore.core import InvalidArgument, SlotMap, SlotRange, TableSpec
from recstore.core.cache_figures import CacheFigures, ClientCache
from recstore.core.proto_convert import (
    SavedCheckpoint,
    TableStats,
    bearer_metadata,
    bearer_token_of,
    checkpoint_from_proto,
    checkpoint_to_proto,
    create_table_request,
    read_create_table_request,
    slot_map_from_proto,
    slot_map_from_proto_or_none,
    slot_map_to_proto,
    spec_from_json,
    spec_to_json,
    table_stats_from_proto,
    table_stats_to_proto,
)
from recstore.v1 import ps_pb2

SLOT_MAPS = {
    "one shard": SlotMap.initial(1),
    "three shards": SlotMap.initial(3),
    "a slot each": SlotMap.initial(16384),
    "moved ranges": SlotMap(
        epoch=7,
        ranges=(SlotRange(0, 100, 1), SlotRange(100, 9000, 0), SlotRange(9000, 16384, 1)),
    ),
    "unsorted ranges, huge epoch": SlotMap(
        epoch=2**40, ranges=(SlotRange(8192, 16384, 0), SlotRange(0, 8192, 1))
    ),
}

SPECS = {
    "defaults": TableSpec(name="user_emb", num_embeddings=1000, embedding_dim=16),
    "hashed lru bfloat16 adam": TableSpec.model_validate(
        {
            "name": "items",
            "numEmbeddings": 10**9,
            "embeddingDim": 8,
            "dtype": "bfloat16",
            "shards": 4,
            "keys": {"mode": "hashed", "capacity": 5000, "eviction": "lru"},
            "optimizer": {"kind": "adam"},
        }
    ),
    "float16 adagrad, uniform init": TableSpec.model_validate(
        {
            "name": "clicks",
            "numEmbeddings": 50,
            "embeddingDim": 4,
            "dtype": "float16",
            "initializer": {"kind": "uniform", "seed": 3},
            "optimizer": {"kind": "adagrad"},
        }
    ),
}


@pytest.mark.parametrize("slot_map", SLOT_MAPS.values(), ids=SLOT_MAPS.keys())
def test_slot_map_round_trip(slot_map: SlotMap) -> None:
    message = slot_map_to_proto(slot_map)
    assert len(message.ranges) == len(slot_map.ranges)
    parsed = ps_pb2.SlotMap.FromString(message.SerializeToString())
    assert slot_map_from_proto(parsed) == slot_map
    assert slot_map_from_proto_or_none(parsed) == slot_map


def test_an_empty_slot_map_is_unset_or_refused() -> None:
    assert slot_map_from_proto_or_none(ps_pb2.SlotMap()) is None
    assert slot_map_from_proto_or_none(ps_pb2.SlotMap(epoch=3)) is None
    with pytest.raises(ValueError, match="slot ranges end at 0"):
        slot_map_from_proto(ps_pb2.SlotMap(epoch=3))


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([(0, 100, 0)], "end at 100"),
        ([(0, 100, 0), (200, 16384, 1)], "without gaps"),
        ([(0, 9000, 0), (8000, 16384, 1)], "without gaps"),
        ([(0, 0, 0), (0, 16384, 1)], "without gaps"),
    ],
    ids=["short", "gap", "overlap", "empty range"],
)
def test_bad_slot_maps_are_refused(ranges: list[tuple[int, int, int]], message: str) -> None:
    proto = ps_pb2.SlotMap(
        epoch=1, ranges=[ps_pb2.SlotRange(start=s, end=e, shard=h) for s, e, h in ranges]
    )
    for read in (slot_map_from_proto, slot_map_from_proto_or_none):
        with pytest.raises(ValueError, match=message):
            read(proto)


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_spec_round_trip(spec: TableSpec) -> None:
    assert spec_from_json(spec_to_json(spec)) == spec


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("{", InvalidArgument, "spec_json is not JSON"),
        ("", InvalidArgument, "spec_json is not JSON"),
        ("[1, 2]", ValidationError, "TableSpec"),
        (
            '{"name": "x", "num_embeddings": 0, "embedding_dim": 8}',
            ValidationError,
            "num_embeddings",
        ),
        ('{"name": "Bad Name", "num_embeddings": 1, "embedding_dim": 1}', ValidationError, "name"),
    ],
    ids=["truncated", "empty", "not an object", "zero rows", "bad name"],
)
def test_bad_spec_json_raises_a_clear_error(
    text: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        spec_from_json(text)
    assert issubclass(error, ValueError)  # the node maps both to INVALID_ARGUMENT


@pytest.mark.parametrize("slot_map", [None, *SLOT_MAPS.values()], ids=["none", *SLOT_MAPS])
@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_create_table_request_round_trip(spec: TableSpec, slot_map: SlotMap | None) -> None:
    request = create_table_request(spec, slot_map)
    assert request.HasField("slot_map") is (slot_map is not None)
    parsed = ps_pb2.CreateTableRequest.FromString(request.SerializeToString())
    assert read_create_table_request(parsed) == (spec, slot_map)


def test_a_create_request_with_a_set_but_empty_slot_map_is_refused() -> None:
    request = create_table_request(SPECS["defaults"])
    request.slot_map.SetInParent()
    with pytest.raises(ValueError, match="slot ranges"):
        read_create_table_request(request)


@pytest.mark.parametrize(
    ("token", "metadata"),
    [
        (None, ()),
        ("", ()),
        ("s3cret", (("authorization", "Bearer s3cret"),)),
        ("rs_a.b-c", (("authorization", "Bearer rs_a.b-c"),)),
    ],
)
def test_bearer_metadata(token: str | None, metadata: tuple[tuple[str, str], ...]) -> None:
    assert bearer_metadata(token) == metadata
    assert bearer_token_of(metadata) == (token or None)


@pytest.mark.parametrize(
    ("metadata", "token"),
    [
        ((("authorization", "Bearer s3cret"),), "s3cret"),
        ((("authorization", "bearer  s3cret "),), "s3cret"),
        ((("x-other", "1"), ("authorization", "Bearer s3cret")), "s3cret"),
        ((("authorization", "Basic s3cret"),), None),
        ((("authorization", "s3cret"),), None),
        ((("authorization", "Basic x"), ("authorization", "Bearer s3cret")), None),  # first wins
        ((("x-other", "Bearer s3cret"),), None),
        ((), None),
        (None, None),
    ],
)
def test_bearer_token_of(metadata: Any, token: str | None) -> None:
    assert bearer_token_of(metadata) == token


STATS = {
    "full": TableStats(
        table="items",
        size=10,
        capacity=5000,
        memory_bytes=1 << 20,
        dtype="bfloat16",
        dim=8,
        spec=SPECS["hashed lru bfloat16 adam"],
        shard_index=2,
        num_shards=4,
        slot_map=SlotMap.initial(4),
        engine={"evictions": 3.0, "load_factor": 0.25},
        client_caches=(
            ClientCache("host:7:train", "nve_0", "lru", CacheFigures(1, 2, 3, 4, 5, 6), 12.5),
            ClientCache("host:7:train", "nve_0", "lru", CacheFigures(6, 5, 4, 3, 2, 1), 1.5, "gpu"),
        ),
    ),
    "no spec, no slot map": TableStats(
        table="t",
        size=0,
        capacity=0,
        memory_bytes=0,
        dtype="float32",
        dim=1,
        spec=None,
        shard_index=0,
        num_shards=1,
        slot_map=None,
    ),
}


@pytest.mark.parametrize("stats", STATS.values(), ids=STATS.keys())
def test_table_stats_round_trip(stats: TableStats) -> None:
    message = table_stats_to_proto(stats)
    assert message.HasField("slot_map") is (stats.slot_map is not None)
    parsed = ps_pb2.TableStats.FromString(message.SerializeToString())
    assert table_stats_from_proto(parsed) == stats


def test_empty_table_stats_read_as_unset() -> None:
    stats = table_stats_from_proto(ps_pb2.TableStats())
    assert stats.spec is None and stats.slot_map is None and stats.engine == {}
    assert (stats.table, stats.size, stats.shard_index, stats.num_shards) == ("", 0, 0, 0)


def test_table_stats_with_a_bad_spec_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="spec_json is not JSON"):
        table_stats_from_proto(ps_pb2.TableStats(spec_json="{"))


CHECKPOINTS = {
    "full": SavedCheckpoint(
        checkpoint_id="final-20260101",
        path="/data/ckpt/final-20260101",
        sequence=42,
        created_unix=1767225600.5,
        tables=("clicks", "items"),
        rows=123,
        bytes=4096,
    ),
    "empty": SavedCheckpoint(
        checkpoint_id="", path="", sequence=0, created_unix=0.0, tables=(), rows=0, bytes=0
    ),
}


@pytest.mark.parametrize("info", CHECKPOINTS.values(), ids=CHECKPOINTS.keys())
def test_checkpoint_round_trip(info: SavedCheckpoint) -> None:
    parsed = ps_pb2.CheckpointInfo.FromString(checkpoint_to_proto(info).SerializeToString())
    assert checkpoint_from_proto(parsed) == info


def test_checkpoint_paths_and_table_lists_of_the_node_convert() -> None:
    class NodeCheckpoint:  # the node's record: a Path and a list, plus fields not sent
        checkpoint_id, path, sequence, created_unix = "c1", Path("/ckpt/c1"), 1, 2.0
        tables, rows, bytes, manifest = ["a", "b"], 3, 4, {"x": 1}

    message = checkpoint_to_proto(NodeCheckpoint())
    assert message.path == "/ckpt/c1" and list(message.tables) == ["a", "b"]
    assert checkpoint_from_proto(message) == SavedCheckpoint(
        "c1", "/ckpt/c1", 1, 2.0, ("a", "b"), 3, 4
    )


@pytest.mark.parametrize(
    ("path", "root", "sent"),
    [
        ("/data/checkpoints/c1", None, "/data/checkpoints/c1"),
        ("/data/checkpoints/c1", "/data", "checkpoints/c1"),
        ("/elsewhere/c1", "/data", "c1"),  # never an absolute path once a root is given
    ],
)
def test_checkpoint_paths_are_sent_relative_to_the_data_dir(
    path: str, root: str | None, sent: str
) -> None:
    info = SavedCheckpoint("c1", path, 1, 2.0, ("a",), 3, 4)
    message = checkpoint_to_proto(info, root=Path(root) if root else None)
    assert message.path == sent
