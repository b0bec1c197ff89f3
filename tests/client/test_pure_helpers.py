"""Pure helpers of the SDK: tensor conversions, specs, connection choice, wire format."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from recstore.client import connection as conn
from recstore.client.errors import (
    BackendError,
    TableNotInitialized,
    WriteAppliedNotDurable,
    WriteNotApplied,
)
from recstore.client.initial_data import chunk_bounds
from recstore.client.remote.nodes import ambiguous, map_rpc_error
from recstore.client.remote.tables import parse_discovery, parse_endpoints
from recstore.client.specs import build_spec, check_learning_rate, optimizer_spec, same_layout
from recstore.client.tensors import (
    as_id_tensor,
    check_id_range,
    coalesce,
    last_write_wins,
    rows_from_numpy,
    rows_to_numpy,
)
from recstore.core import DType, InvalidArgument, SlotMap, TableSpec, WrongShard
from recstore.core import wire as core_wire


@pytest.mark.parametrize(
    "ids",
    [
        torch.tensor([1, 2, 3], dtype=torch.int32),
        np.array([1, 2, 3], dtype=np.uint8),
        [1, 2, 3],
        torch.tensor([[1, 2, 3]])[0],
    ],
)
def test_ids_become_int64(ids) -> None:
    out = as_id_tensor(ids)
    assert out.dtype == torch.int64 and out.tolist() == [1, 2, 3] and out.is_contiguous()


@pytest.mark.parametrize(
    ("ids", "error"),
    [
        (torch.tensor([1.0]), TypeError),
        (torch.tensor([[1, 2]]), ValueError),
        (torch.tensor(3), ValueError),
    ],
)
def test_bad_ids_are_refused(ids, error) -> None:
    with pytest.raises(error):
        as_id_tensor(ids)


@pytest.mark.parametrize(
    ("ids", "low", "high", "ok"),
    [([0, 9], 0, 10, True), ([10], 0, 10, False), ([-1], 0, 10, False), ([4], 5, 10, False),
     ([5, 9], 5, 10, True), ([-(2**60)], 0, None, True)],
)  # fmt: skip
def test_id_range(ids, low, high, ok) -> None:
    if ok:
        check_id_range(torch.tensor(ids), low, high, "t")
    else:
        with pytest.raises(ValueError, match="out of range"):
            check_id_range(torch.tensor(ids), low, high, "t")


def test_coalesce_sums_duplicates_like_torch_sparse() -> None:
    ids = torch.tensor([5, 1, 5, 3, 1, 5])
    grads = torch.randn(6, 4)
    keys, summed = coalesce(ids, grads)
    reference = torch.sparse_coo_tensor(
        ids.unsqueeze(0), grads, (10, 4), check_invariants=True
    ).coalesce()
    assert keys.tolist() == reference.indices()[0].tolist()
    torch.testing.assert_close(summed, reference.values())


def test_last_write_wins() -> None:
    ids = torch.tensor([2, 7, 2, 9, 7])
    values = torch.arange(5, dtype=torch.float32).unsqueeze(1).repeat(1, 3)
    keys, rows = last_write_wins(ids, values)
    assert keys.tolist() == [2, 7, 9]
    assert rows[:, 0].tolist() == [2.0, 4.0, 3.0]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {"num_embeddings": 10, "optimizer": ("sgd", 0.01), "init": "zeros"}),
        ({"base_offset": 5}, {"num_embeddings": 15}),
        ({"optimizer": "adagrad", "lr": 0.5}, {"optimizer": ("adagrad", 0.5)}),
        (
            {"metadata": {"optimizer": {"kind": "adam", "lr": 0.001}}},
            {"optimizer": ("adam", 0.001)},
        ),
        (
            {"metadata": {"initializer": {"kind": "uniform"}}, "server_initialised": True},
            {"init": "uniform"},
        ),
        ({"metadata": {"initializer": {"kind": "uniform"}}}, {"init": "zeros"}),
        ({"metadata": {"keys": {"mode": "hashed"}}, "base_offset": 100}, {"num_embeddings": 10}),
        ({"metadata": {"shards": 4}}, {"shards": 4}),
    ],
)
def test_build_spec(kwargs, expected) -> None:
    spec = build_spec("t_1", (10, 8), torch.float16, **kwargs)
    assert spec.embedding_dim == 8 and DType(spec.dtype) == DType.float16
    if "num_embeddings" in expected:
        assert spec.num_embeddings == expected["num_embeddings"]
    if "optimizer" in expected:
        assert (spec.optimizer.kind, spec.optimizer.lr) == expected["optimizer"]
    if "init" in expected:
        assert spec.initializer.kind == expected["init"]
    if "shards" in expected:
        assert spec.shards == expected["shards"]


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (("t", (0, 8), torch.float32), {}, ValueError),
        (("t", (10,), torch.float32), {}, ValueError),
        (("t", (10, 8), torch.int64), {}, TypeError),
        (("Bad Name", (10, 8), torch.float32), {}, ValueError),
        (("t", (10, 8), torch.float32), {"base_offset": -1}, ValueError),
        (("t", (10, 8), torch.float32), {"metadata": {"colour": 1}}, ValueError),
        (("t", (10, 8), torch.float32), {"optimizer": "lion"}, ValueError),
        (
            ("t", (10, 8), torch.float32),
            {"optimizer": "sgd", "metadata": {"optimizer": "sgd"}},
            ValueError,
        ),
    ],
)
def test_build_spec_rejects(args, kwargs, error) -> None:
    with pytest.raises(error):
        build_spec(*args, **kwargs)


@pytest.mark.parametrize("lr", [0, -1, float("nan"), float("inf"), "0.1", True])
def test_bad_learning_rates(lr) -> None:
    with pytest.raises(ValueError):
        check_learning_rate(lr)


def test_optimizer_spec_keeps_explicit_lr() -> None:
    assert optimizer_spec({"kind": "adagrad", "lr": 0.3}, 0.01).lr == 0.3


def test_same_layout() -> None:
    a = TableSpec(name="a", num_embeddings=10, embedding_dim=4)
    assert same_layout(a, a.model_copy(update={"shards": 3}))
    assert not same_layout(a, a.model_copy(update={"embedding_dim": 5}))
    assert not same_layout(a, a.model_copy(update={"dtype": "float16"}))


@pytest.mark.parametrize(
    ("env", "backend", "endpoints", "admin"),
    [
        ({}, "local", None, None),
        ({"RECSTORE_PS_ENDPOINTS": "a:1, b:2"}, "grpc", ("a:1", "b:2"), None),
        ({"RECSTORE_ADMIN_URL": "http://x:8080"}, "grpc", None, "http://x:8080"),
        ({"RECSTORE_PS_ENDPOINTS": " "}, "local", None, None),
    ],
)
def test_connection_from_environment(env, backend, endpoints, admin) -> None:
    c = conn.from_environment(env)
    assert (c.backend, c.endpoints, c.admin_url) == (backend, endpoints, admin)


def test_connection_changes() -> None:
    c = conn.from_environment({})
    assert conn.with_endpoints(c, "h:1").endpoints == ("h:1",)
    assert not conn.with_backend(c, "grpc").configured
    with pytest.raises(ValueError):
        conn.with_backend(c, "redis")
    with pytest.raises(ValueError):
        conn.with_admin(c, "x:8080", None)


@pytest.mark.parametrize("raw", ["", "host", "host:", ":80", "h:0", "h:70000", "h:x"])
def test_bad_endpoints(raw) -> None:
    with pytest.raises(ValueError):
        parse_endpoints(raw)


def test_discovery_document() -> None:
    spec = TableSpec(name="t", num_embeddings=100, embedding_dim=8, shards=2)
    doc = {
        "name": "t",
        "spec": spec.to_wire(),
        "shards": 2,
        "slot_map": SlotMap.initial(2).to_dict(),
        "endpoints": ["a:1", "b:2"],
    }
    found = parse_discovery(doc)
    assert found.spec == spec and found.endpoints == ("a:1", "b:2") and found.slot_map.epoch == 1
    with pytest.raises(ValueError):
        parse_discovery({**doc, "endpoints": ["a:1"]})
    with pytest.raises(ValueError):
        parse_discovery({k: v for k, v in doc.items() if k != "slot_map"})


@pytest.mark.parametrize("dtype", [DType.float32, DType.float16, DType.bfloat16])
def test_rows_roundtrip_through_wire_bytes(dtype) -> None:
    rows = torch.randn(5, 3).to({"float32": torch.float32, "float16": torch.float16,
                                 "bfloat16": torch.bfloat16}[dtype.value])  # fmt: skip
    buffer = rows_to_numpy(rows).tobytes()
    assert len(buffer) == 5 * 3 * dtype.itemsize
    back = rows_from_numpy(core_wire.rows_view(buffer, 5, 3, dtype).copy(), dtype)
    assert torch.equal(back, rows)
    with pytest.raises(InvalidArgument):
        core_wire.rows_view(buffer[:-1], 5, 3, dtype)


@pytest.mark.parametrize(
    ("code", "metadata", "expected"),
    [
        (grpc.StatusCode.NOT_FOUND, (), TableNotInitialized),
        (grpc.StatusCode.FAILED_PRECONDITION, (("x-recstore-epoch", "7"),), WrongShard),
        (grpc.StatusCode.FAILED_PRECONDITION, (), BackendError),
        (grpc.StatusCode.INVALID_ARGUMENT, (), BackendError),
        (
            grpc.StatusCode.UNAVAILABLE,
            (),
            BackendError,
        ),  # e.g. the connection dropped: outcome unknown
        (grpc.StatusCode.UNAVAILABLE, (("x-recstore-applied", "false"),), WriteNotApplied),
        (grpc.StatusCode.DATA_LOSS, (("x-recstore-applied", "true"),), WriteAppliedNotDurable),
        (grpc.StatusCode.DATA_LOSS, (), BackendError),
        (grpc.StatusCode.UNAVAILABLE, (("x-recstore-applied", "maybe"),), BackendError),
    ],
)
def test_rpc_errors_map_to_sdk_errors(code, metadata, expected) -> None:
    error = map_rpc_error(code, "why", metadata, method="Pull", table="t", endpoint="h:1")
    assert type(error) is expected
    if isinstance(error, WrongShard):
        assert error.epoch == 7
    else:
        assert isinstance(error, BackendError) and "why" in str(error) and error.reason == "why"
        assert error.status is code and error.code == code.name
    if isinstance(error, WriteNotApplied | WriteAppliedNotDurable):
        assert error.applied is (expected is WriteAppliedNotDurable)


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, metadata: tuple[tuple[str, str], ...]) -> None:
        self._code, self._metadata = code, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


@pytest.mark.parametrize(
    ("code", "metadata", "resent"),
    [
        (grpc.StatusCode.UNAVAILABLE, (), True),  # the connection dropped
        (grpc.StatusCode.DEADLINE_EXCEEDED, (), True),
        (grpc.StatusCode.CANCELLED, (), True),  # a stopping node cancelled it after its drain
        (grpc.StatusCode.UNAVAILABLE, (("x-recstore-applied", "false"),), False),  # said
        (grpc.StatusCode.DATA_LOSS, (("x-recstore-applied", "true"),), False),
        (grpc.StatusCode.FAILED_PRECONDITION, (("x-recstore-epoch", "3"),), False),  # router's
        (grpc.StatusCode.INVALID_ARGUMENT, (), False),
        (grpc.StatusCode.ABORTED, (), False),  # outside the window: must not be sent again
    ],
)
def test_only_writes_of_unknown_outcome_are_resent(code, metadata, resent) -> None:
    assert ambiguous(_Failed(code, metadata)) is resent


@pytest.mark.parametrize(
    ("rows", "row_bytes", "chunk", "expected"),
    [
        (10, 4, 40, [(0, 10)]),
        (10, 4, 16, [(0, 4), (4, 8), (8, 10)]),
        (3, 100, 1, [(0, 1), (1, 2), (2, 3)]),
    ],
)
def test_chunk_bounds(rows, row_bytes, chunk, expected) -> None:
    assert chunk_bounds(rows, row_bytes, chunk) == expected
