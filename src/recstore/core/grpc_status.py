"""The gRPC status of every RecStore failure, and what a status says back: one table.

A PS node ends a failed call with the status its error maps to here, plus the
trailing metadata that says more (the node's slot-map epoch on a wrong-owner
refusal, whether a refused or failed write was applied). The SDK reads both
back with the functions below, the local store (no gRPC between the trainer
and its table) reports the status the node would, and the control clients
keep the status as it came. Everyone matches ``grpc.StatusCode`` members,
never their names.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from recstore.core.errors import (
    APPLIED_METADATA_KEY,
    CapacityExhausted,
    CarriedUpdatesApplied,
    CheckpointCorrupt,
    CheckpointNotFound,
    DeviceUnavailable,
    InferenceTable,
    InvalidArgument,
    MessageTooLarge,
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
from recstore.core.routing import EPOCH_METADATA_KEY

Code = grpc.StatusCode
Metadata = tuple[tuple[str, str], ...]

#: checked in order: the first matching class wins (subclasses before bases).
STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (WrongShard, Code.FAILED_PRECONDITION),
    (CarriedUpdatesApplied, Code.ABORTED),
    # a resend the de-dup window can no longer check: refused, maybe applied before
    (RequestOutcomeUnknown, Code.ABORTED),
    # a write refused after a log failure: nothing applied, safe to send again later
    (WritesStopped, Code.UNAVAILABLE),
    # applied in memory, its log record not durable: never resend it blindly
    (WriteNotDurable, Code.DATA_LOSS),
    (TableNotFound, Code.NOT_FOUND),
    (CheckpointNotFound, Code.NOT_FOUND),
    (TableExists, Code.ALREADY_EXISTS),
    (CapacityExhausted, Code.RESOURCE_EXHAUSTED),
    (MessageTooLarge, Code.RESOURCE_EXHAUSTED),  # over the node's message limit
    (MemoryError, Code.RESOURCE_EXHAUSTED),  # a table larger than this host
    (DeviceUnavailable, Code.FAILED_PRECONDITION),  # e.g. a GPU table, no GPU
    (TableUnrecoverable, Code.FAILED_PRECONDITION),  # damaged data, never empty
    (InferenceTable, Code.FAILED_PRECONDITION),  # an update of a mode: inference table
    (SlotMapConflict, Code.ABORTED),  # SetSlotMap's compare-and-swap lost
    (ReshardConflict, Code.FAILED_PRECONDITION),  # a step out of order
    (SealTimeout, Code.DEADLINE_EXCEEDED),  # unsealed again: the move may retry
    (Unauthenticated, Code.UNAUTHENTICATED),
    (CheckpointCorrupt, Code.DATA_LOSS),
    (InvalidArgument, Code.INVALID_ARGUMENT),
    (ValueError, Code.INVALID_ARGUMENT),  # pydantic ValidationError included
    (TypeError, Code.INVALID_ARGUMENT),  # the engine's wrong-dtype error
    (OSError, Code.UNAVAILABLE),  # disk trouble: the client may retry elsewhere
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


def trailing_metadata_of(error: BaseException) -> Metadata:
    """What a node's failed call says beyond its status (read back by the two below)."""
    if isinstance(error, WrongShard):
        return ((EPOCH_METADATA_KEY, str(error.epoch)),)
    for cls, applied in APPLIED_OF:
        if isinstance(error, cls):
            return ((APPLIED_METADATA_KEY, "true" if applied else "false"),)
    return ()


def node_epoch(trailing_metadata: Iterable[tuple[str, str]] | None) -> int | None:
    """The refusing node's slot-map epoch, None when absent (not a wrong-owner refusal)."""
    for key, value in trailing_metadata or ():
        if key == EPOCH_METADATA_KEY:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def applied_of(trailing_metadata: Iterable[tuple[str, str]] | None) -> bool | None:
    """Whether a failed write was applied (``x-recstore-applied``), None when unsaid."""
    for key, value in trailing_metadata or ():
        if key == APPLIED_METADATA_KEY:
            return {"true": True, "false": False}.get(str(value))
    return None
