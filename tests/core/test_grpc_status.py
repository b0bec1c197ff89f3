"""The one failure <-> gRPC status table: what a node answers, and what a client reads back."""

from __future__ import annotations

import inspect

import grpc
import pytest
from pydantic import ValidationError

from recstore.core import TableSpec, errors
from recstore.core.errors import (
    CapacityExhausted,
    CarriedUpdatesApplied,
    CheckpointCorrupt,
    CheckpointNotFound,
    DeviceUnavailable,
    InferenceTable,
    InvalidArgument,
    MessageTooLarge,
    NonFiniteValues,
    RecStoreError,
    RequestOutcomeUnknown,
    ReshardConflict,
    SealTimeout,
    SlotMapConflict,
    TableExists,
    TableNotFound,
    TableUnrecoverable,
    Unauthenticated,
    WriteNotDurable,
    WritesStopped,
    WrongShard,
)
from recstore.core.grpc_status import (
    STATUS_OF,
    applied_of,
    node_epoch,
    status_of,
    trailing_metadata_of,
)

Code = grpc.StatusCode


def _validation_error() -> ValidationError:
    try:
        TableSpec(name="Bad Name", num_embeddings=1, embedding_dim=1)
    except ValidationError as error:
        return error
    raise AssertionError("spec should not validate")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TableNotFound("t"), Code.NOT_FOUND),
        (CheckpointNotFound("c"), Code.NOT_FOUND),
        (InvalidArgument("x"), Code.INVALID_ARGUMENT),
        (NonFiniteValues("nan", table="t"), Code.INVALID_ARGUMENT),
        (TypeError("dtype"), Code.INVALID_ARGUMENT),
        (_validation_error(), Code.INVALID_ARGUMENT),
        (TableExists("t"), Code.ALREADY_EXISTS),
        (CapacityExhausted("full"), Code.RESOURCE_EXHAUSTED),
        (MessageTooLarge("reply over the limit"), Code.RESOURCE_EXHAUSTED),
        (WrongShard("moved", 7), Code.FAILED_PRECONDITION),
        (DeviceUnavailable("no GPU"), Code.FAILED_PRECONDITION),
        (InferenceTable.of("t"), Code.FAILED_PRECONDITION),
        (TableUnrecoverable("damaged"), Code.FAILED_PRECONDITION),
        (ReshardConflict("out of order"), Code.FAILED_PRECONDITION),
        (SlotMapConflict("epoch moved"), Code.ABORTED),  # before its base class
        (CarriedUpdatesApplied("pull failed"), Code.ABORTED),
        (RequestOutcomeUnknown("evicted"), Code.ABORTED),
        (SealTimeout("busy"), Code.DEADLINE_EXCEEDED),
        (Unauthenticated("token"), Code.UNAUTHENTICATED),
        (CheckpointCorrupt("c", None, "digest"), Code.DATA_LOSS),
        (MemoryError("cannot reserve"), Code.RESOURCE_EXHAUSTED),
        (WritesStopped("log failed"), Code.UNAVAILABLE),
        (WriteNotDurable("fsync failed"), Code.DATA_LOSS),
        (OSError(28, "No space left on device"), Code.UNAVAILABLE),
        (RuntimeError("bug"), None),
    ],
)
def test_status_of(error: BaseException, code: grpc.StatusCode | None) -> None:
    assert status_of(error) is code


def test_every_error_a_component_raises_has_its_status() -> None:
    """No RecStore error of the shared module reaches a caller as INTERNAL (a bug)."""
    defined = [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, RecStoreError) and cls is not RecStoreError
    ]
    assert len(defined) >= 19
    for cls in defined:
        assert any(issubclass(cls, mapped) for mapped, _ in STATUS_OF), cls.__name__
    # a subclass listed after one of its bases would never be reached
    for i, (cls, _) in enumerate(STATUS_OF):
        assert not any(issubclass(cls, base) for base, _ in STATUS_OF[:i]), cls.__name__


def test_wrong_shard_carries_epoch() -> None:
    assert trailing_metadata_of(WrongShard("moved", 7)) == (("x-recstore-epoch", "7"),)
    assert trailing_metadata_of(TableNotFound("t")) == ()


def test_a_failed_write_says_whether_it_was_applied() -> None:
    assert trailing_metadata_of(WritesStopped("log failed")) == (("x-recstore-applied", "false"),)
    assert trailing_metadata_of(WriteNotDurable("fsync")) == (("x-recstore-applied", "true"),)
    assert trailing_metadata_of(OSError(28, "No space left on device")) == ()


@pytest.mark.parametrize(
    ("error", "epoch", "applied"),
    [
        (WrongShard("moved", 7), 7, None),
        (WritesStopped("log failed"), None, False),
        (WriteNotDurable("fsync"), None, True),
        (CarriedUpdatesApplied("pull failed"), None, True),
        (TableNotFound("t"), None, None),
    ],
)
def test_what_a_node_says_is_what_a_client_reads(
    error: BaseException, epoch: int | None, applied: bool | None
) -> None:
    metadata = trailing_metadata_of(error)
    assert (node_epoch(metadata), applied_of(metadata)) == (epoch, applied)


def test_metadata_a_node_did_not_write_says_nothing() -> None:
    assert node_epoch(None) is None and applied_of(None) is None
    assert node_epoch((("x-recstore-epoch", "seven"),)) is None
    assert applied_of((("x-recstore-applied", "maybe"),)) is None
