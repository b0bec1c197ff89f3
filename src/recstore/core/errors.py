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


class NonFiniteValues(InvalidArgument):
    """A batch holds NaN or infinite values and the table's ``nonFinite`` policy is reject.

    Nothing of the batch was applied (gRPC INVALID_ARGUMENT, as any bad input);
    ``table`` names the table that refused it.
    """

    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table


class CapacityExhausted(RecStoreError):
    """A hashed table without eviction is full (gRPC RESOURCE_EXHAUSTED)."""


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
