"""Errors every component raises and maps: one class per wire status.

The PS node maps these to gRPC status codes, the admin API to HTTP statuses,
the SDK back to the exceptions its documentation promises, so each layer
decides once how a failure looks to its caller.
"""

from __future__ import annotations


class RecStoreError(Exception):
    """Base of every RecStore failure."""


class TableNotFound(RecStoreError, KeyError):
    """No table of that name (gRPC NOT_FOUND, HTTP 404)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "table not found"


class TableExists(RecStoreError):
    """A table of that name exists with another spec (gRPC ALREADY_EXISTS, HTTP 409)."""


class InvalidArgument(RecStoreError, ValueError):
    """Bad shape, dtype, buffer length or id (gRPC INVALID_ARGUMENT, HTTP 422)."""


class MalformedMessage(InvalidArgument):
    """Bytes that do not parse as the message they should be (gRPC INVALID_ARGUMENT).

    A node answers it without a traceback: the fault is the sender's, and nothing
    was read, so nothing changed.
    """


class NonFiniteValues(InvalidArgument):
    """A batch holds NaN or infinite values and the table's ``nonFinite`` policy is reject.

    Nothing of the batch was applied (gRPC INVALID_ARGUMENT, as any bad input);
    ``table`` names the table that refused it.
    """

    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table


class InferenceTable(RecStoreError):
    """An update (gradients) of a table opened with ``mode: inference`` (gRPC FAILED_PRECONDITION).

    Nothing was applied; the table keeps no optimizer state to apply them to.
    """

    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table

    @classmethod
    def of(cls, table: str) -> InferenceTable:
        """The refusal of an update of ``table``, worded once for every layer."""
        return cls(f"table {table!r} is an inference table: updates are refused", table=table)


class CapacityExhausted(RecStoreError):
    """A hashed table without eviction is full (gRPC RESOURCE_EXHAUSTED)."""


class MessageTooLarge(RecStoreError):
    """A request or reply over the node's message limit (gRPC RESOURCE_EXHAUSTED).

    The message names the limit; smaller batches fit.
    """


class DeviceUnavailable(RecStoreError, RuntimeError):
    """The table needs a device this node does not have, e.g. a GPU (gRPC FAILED_PRECONDITION).

    Retrying on the same node cannot help: a provisioner reports it and backs off.
    """


class Unauthenticated(RecStoreError):
    """Missing or wrong token (gRPC UNAUTHENTICATED, HTTP 401)."""


class WrongShard(RecStoreError):
    """Keys of slots this node does not own; carries the node's slot-map epoch."""

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


#: trailing metadata of a refused or failed write: "false" when nothing of it was
#: applied (safe to send again), "true" when it was applied in memory but is not durable
APPLIED_METADATA_KEY = "x-recstore-applied"


class WritesStopped(RecStoreError):
    """The node's write-ahead log failed: it accepts no writes until the log works again.

    Nothing of the refused request was applied (gRPC UNAVAILABLE, ``x-recstore-applied:
    false``): sending it again later, or after the node restarts, is safe.
    """


class WriteNotDurable(RecStoreError):
    """The write was applied in memory, but its log record could not be made durable.

    The node stops accepting writes (gRPC DATA_LOSS, ``x-recstore-applied: true``); the
    write is durable once the node resumes and lost if it restarts before. Never resend
    it blindly: it is applied.
    """


# What the PS node answers beyond the data path's refusals: raised by its checkpoint,
# de-dup, resharding and recovery code, defined here so that the one status table
# (``recstore.core.grpc_status``) names every error a node may answer.


class CheckpointCorrupt(RecStoreError):
    """A checkpoint whose manifest or files do not verify (gRPC DATA_LOSS)."""

    def __init__(self, checkpoint_id: str, table: str | None, reason: str) -> None:
        where = f"checkpoint {checkpoint_id!r}" + (f", table {table!r}" if table else "")
        super().__init__(f"{where}: {reason}")
        self.checkpoint_id = checkpoint_id
        self.table = table  # None: the manifest itself
        self.reason = reason


class CheckpointNotFound(RecStoreError):
    """No checkpoint with that id (gRPC NOT_FOUND)."""


class RequestOutcomeUnknown(RecStoreError):
    """A resend this node can no longer check (evicted, or known to some tables only):
    refused, nothing applied; it may have been applied before (gRPC ABORTED)."""


class CarriedUpdatesApplied(RecStoreError):
    """A MultiPull failed after the updates it carried were applied: do not resend them."""


class TableUnrecoverable(RecStoreError):
    """A table whose saved state could not be restored: refused (gRPC FAILED_PRECONDITION)."""


class ReshardConflict(RecStoreError):
    """A reshard step that does not fit the node's state (gRPC FAILED_PRECONDITION)."""


class SlotMapConflict(ReshardConflict):
    """SetSlotMap's expected epoch is not the node's (the compare-and-swap failed)."""


class SealTimeout(RecStoreError):
    """Requests already inside did not finish before the seal's deadline (unsealed again)."""
