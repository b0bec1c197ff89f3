"""The SDK reads failures through the one status table (``recstore.core.grpc_status``).

A remote table's failure arrives as a gRPC status and trailing metadata, which
the SDK matches by ``grpc.StatusCode`` member; a local table's failure is the
engine's exception, which the SDK reports with the status a PS node would have
answered for it: a caller sees the same ``BackendError.status`` either way.
"""

from __future__ import annotations

import grpc
import pytest

from recstore.client.backends.local import _backend_error
from recstore.client.errors import (
    BackendError,
    TableNotInitialized,
    WriteAppliedNotDurable,
    WriteNotApplied,
)
from recstore.client.remote.nodes import map_rpc_error
from recstore.core.errors import (
    CapacityExhausted,
    CarriedUpdatesApplied,
    DeviceUnavailable,
    InferenceTable,
    InvalidArgument,
    MessageTooLarge,
    NonFiniteValues,
    RecStoreError,
    TableExists,
    TableNotFound,
    WriteNotDurable,
    WritesStopped,
    WrongShard,
)
from recstore.core.grpc_status import status_of, trailing_metadata_of

ENGINE_ERRORS = [
    InvalidArgument("bad ids"),
    NonFiniteValues("nan in rows", table="t"),
    CapacityExhausted("full"),
    InferenceTable.of("t"),
    DeviceUnavailable("no GPU"),
    TableExists("t"),
    MessageTooLarge("over the limit"),
    TableNotFound("t"),
]


@pytest.mark.parametrize("error", ENGINE_ERRORS, ids=lambda e: type(e).__name__)
def test_a_local_failure_has_the_status_a_node_would_answer(error: RecStoreError) -> None:
    reported = _backend_error(error, "t")
    assert reported.status is status_of(error) and reported.status is not None
    assert reported.code == reported.status.name
    assert isinstance(reported, TableNotInitialized) is isinstance(error, TableNotFound)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (WrongShard("slots moved", 9), WrongShard),
        (TableNotFound("t"), TableNotInitialized),
        (WritesStopped("log failed"), WriteNotApplied),
        (WriteNotDurable("fsync failed"), WriteAppliedNotDurable),
        (CarriedUpdatesApplied("the pull failed"), BackendError),
        (CapacityExhausted("full"), BackendError),
    ],
    ids=lambda e: e.__name__ if isinstance(e, type) else type(e).__name__,
)
def test_what_a_node_answers_is_the_error_the_sdk_raises(
    error: RecStoreError, expected: type[Exception]
) -> None:
    code = status_of(error)
    assert code is not None
    raised = map_rpc_error(
        code, str(error), trailing_metadata_of(error), method="Pull", table="t", endpoint="h:1"
    )
    assert type(raised) is expected
    if isinstance(error, WrongShard):
        assert isinstance(raised, WrongShard) and raised.epoch == 9
    else:
        assert isinstance(raised, BackendError) and raised.status is code


def test_a_status_is_given_as_its_member_not_its_name() -> None:
    with pytest.raises(TypeError, match=r"grpc\.StatusCode, not its name 'UNAVAILABLE'"):
        BackendError("down", code="UNAVAILABLE")
    error = BackendError("down", code=grpc.StatusCode.UNAVAILABLE)
    assert (error.status, error.code) == (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE")
    http = BackendError("forbidden", code="HTTP_403")  # not a gRPC status: no member
    assert (http.status, http.code) == (None, "HTTP_403")
