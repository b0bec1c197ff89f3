"""Admin-service failures and the HTTP status each maps to.

Table lookups raise the shared ``recstore.core`` errors (TableNotFound,
TableExists, InvalidArgument); the rest are specific to the catalogue.
"""

from __future__ import annotations

from recstore.core.errors import InvalidArgument, RecStoreError, TableExists, TableNotFound


class NotFound(RecStoreError):
    """No node, checkpoint or token with that id (HTTP 404)."""


class VersionConflict(RecStoreError):
    """The resource changed since the caller read it (HTTP 409)."""


class NotReady(RecStoreError):
    """The table exists but cannot be served yet (HTTP 503)."""


class ProvisioningError(RecStoreError):
    """The provisioner (Kubernetes API, local) refused or failed; nothing was written."""

    def __init__(self, message: str, status_code: int = 502) -> None:
        super().__init__(message)
        self.status_code = status_code


HTTP_STATUS: dict[type[Exception], int] = {
    TableNotFound: 404,
    NotFound: 404,
    TableExists: 409,
    VersionConflict: 409,
    InvalidArgument: 422,
    NotReady: 503,
}


def http_status_of(error: Exception) -> int:
    if isinstance(error, ProvisioningError):
        return error.status_code
    for cls, status in HTTP_STATUS.items():
        if isinstance(error, cls):
            return status
    return 500
