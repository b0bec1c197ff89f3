"""Token check and the failure -> status-code table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from recstore.core import (
    CapacityExhausted,
    DeviceUnavailable,
    InvalidArgument,
    MessageTooLarge,
    TableExists,
    TableNotFound,
    TableSpec,
    WriteNotDurable,
    WritesStopped,
    WrongShard,
)
from recstore.ps.auth import is_authorized, read_token_file
from recstore.ps.checkpoint import CheckpointNotFound
from recstore.ps.status import status_of, trailing_metadata_of


@pytest.mark.parametrize(
    ("metadata", "ok"),
    [
        ((("authorization", "Bearer s3cret"),), True),
        ((("authorization", "bearer s3cret"),), True),
        ((("authorization", "Bearer wrong"),), False),
        ((("authorization", "s3cret"),), False),
        ((("authorization", "Basic s3cret"),), False),
        ((("x-other", "Bearer s3cret"),), False),
        ((("authorization", "Bearer s3crét"),), False),  # non-ASCII: refused, not an error
        ((), False),
        (None, False),
    ],
)
def test_bearer_token(metadata: Any, ok: bool) -> None:
    assert is_authorized(metadata, "s3cret") is ok


def test_token_file(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("abc\n")
    assert read_token_file(tmp_path / "t") == "abc"
    (tmp_path / "e").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token_file(tmp_path / "e")


def _validation_error() -> ValidationError:
    try:
        TableSpec(name="Bad Name", num_embeddings=1, embedding_dim=1)
    except ValidationError as error:
        return error
    raise AssertionError("spec should not validate")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TableNotFound("t"), grpc.StatusCode.NOT_FOUND),
        (CheckpointNotFound("c"), grpc.StatusCode.NOT_FOUND),
        (InvalidArgument("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (TypeError("dtype"), grpc.StatusCode.INVALID_ARGUMENT),
        (_validation_error(), grpc.StatusCode.INVALID_ARGUMENT),
        (TableExists("t"), grpc.StatusCode.ALREADY_EXISTS),
        (CapacityExhausted("full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (MessageTooLarge("reply over the limit"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (WrongShard("moved", 7), grpc.StatusCode.FAILED_PRECONDITION),
        (DeviceUnavailable("no GPU"), grpc.StatusCode.FAILED_PRECONDITION),
        (MemoryError("cannot reserve"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (WritesStopped("log failed"), grpc.StatusCode.UNAVAILABLE),
        (WriteNotDurable("fsync failed"), grpc.StatusCode.DATA_LOSS),
        (RuntimeError("bug"), None),
    ],
)
def test_status_of(error: BaseException, code: grpc.StatusCode | None) -> None:
    assert status_of(error) == code


def test_wrong_shard_carries_epoch() -> None:
    assert trailing_metadata_of(WrongShard("moved", 7)) == (("x-recstore-epoch", "7"),)
    assert trailing_metadata_of(TableNotFound("t")) == ()


def test_a_failed_write_says_whether_it_was_applied() -> None:
    assert trailing_metadata_of(WritesStopped("log failed")) == (("x-recstore-applied", "false"),)
    assert trailing_metadata_of(WriteNotDurable("fsync")) == (("x-recstore-applied", "true"),)
    assert trailing_metadata_of(OSError(28, "No space left on device")) == ()
