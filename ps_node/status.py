"""Which gRPC status code each failure becomes (one table, tested on its own)."""

from __future__ import annotations

import grpc

from recstore.core import (
    APPLIED_METADATA_KEY,
    CapacityExhausted,
    DeviceUnavailable,
    InferenceTable,
    InvalidArgument,
    MessageTooLarge,
    TableExists,
    TableNotFound,
    Unauthenticated,
    WriteNotDurable,
    WritesStopped,
    WrongShard,
)
from recstore.core.routing import EPOCH_METADATA_KEY
from recstore.ps.checkpoint import CheckpointCorrupt, CheckpointNotFound
from recstore.ps.dedup import RequestOutcomeUnknown
from recstore.ps.migration import MigrationConflict, SealTimeout
from recstore.ps.migration_ops import SlotMapConflict
from recstore.ps.multi import CarriedUpdatesApplied
from recstore.ps.node_tables import TableUnrecoverable

#: checked in order: the first matching class wins (subclasses before bases).
STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (WrongShard, grpc.StatusCode.FAILED_PRECONDITION),
    (CarriedUpdatesApplied, grpc.StatusCode.ABORTED),
    # a resend the de-dup window can no longer check: refused, maybe applied before
    (RequestOutcomeUnknown, grpc.StatusCode.ABORTED),
    # a write refused after a log failure: nothing applied, safe to send again later
    (WritesStopped, grpc.StatusCode.UNAVAILABLE),
    # applied in memory, its log record not durable: never resend it blindly
    (WriteNotDurable, grpc.StatusCode.DATA_LOSS),
    (TableNotFound, grpc.StatusCode.NOT_FOUND),
    (CheckpointNotFound, grpc.StatusCode.NOT_FOUND),
    (TableExists, grpc.StatusCode.ALREADY_EXISTS),
    (CapacityExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (MessageTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),  # over the node's message limit
    (MemoryError, grpc.StatusCode.RESOURCE_EXHAUSTED),  # a table larger than this host
    (DeviceUnavailable, grpc.StatusCode.FAILED_PRECONDITION),  # e.g. a GPU table, no GPU
    (TableUnrecoverable, grpc.StatusCode.FAILED_PRECONDITION),  # damaged data, never empty
    (InferenceTable, grpc.StatusCode.FAILED_PRECONDITION),  # an update of a mode: inference table
    (SlotMapConflict, grpc.StatusCode.ABORTED),  # SetSlotMap's compare-and-swap lost
    (MigrationConflict, grpc.StatusCode.FAILED_PRECONDITION),  # a step out of order
    (SealTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),  # unsealed again: the move may retry
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (CheckpointCorrupt, grpc.StatusCode.DATA_LOSS),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),  # pydantic ValidationError included
    (TypeError, grpc.StatusCode.INVALID_ARGUMENT),  # the engine's wrong-dtype error
    (OSError, grpc.StatusCode.UNAVAILABLE),  # disk trouble: the client may retry elsewhere
)


def status_of(error: BaseException) -> grpc.StatusCode | None:
    """The status for a known failure, None for a bug (reported as INTERNAL)."""
    for cls, code in STATUS_OF:
        if isinstance(error, cls):
            return code
    return None


#: whether a failed write was applied, for the failures that say (``x-recstore-applied``)
APPLIED_OF: tuple[tuple[type[BaseException], bool], ...] = (
    (WritesStopped, False),
    (WriteNotDurable, True),
    (CarriedUpdatesApplied, True),
)


def trailing_metadata_of(error: BaseException) -> tuple[tuple[str, str], ...]:
    if isinstance(error, WrongShard):
        return ((EPOCH_METADATA_KEY, str(error.epoch)),)
    for cls, applied in APPLIED_OF:
        if isinstance(error, cls):
            return ((APPLIED_METADATA_KEY, "true" if applied else "false"),)
    return ()
