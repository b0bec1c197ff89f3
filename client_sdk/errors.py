"""The SDK's errors: what its documentation promises a trainer.

The documented client raises ``RuntimeError`` for an unknown table or a backend
failure and ``TypeError`` when ``init_data`` meets a table of another shape or
dtype. The classes here are those built-ins, specialised so a caller can tell
the cases apart and read the backend's own reason. Errors about a module's
ids are also the class torch.nn raises for them, so a torch user's ``except``
catches them.
"""

from __future__ import annotations

import grpc

from recstore.core import InvalidArgument


class BackendError(RuntimeError):
    """The backend refused or failed a call; ``reason`` is the server's message.

    ``status``: the gRPC status code (a ``grpc.StatusCode``; None for a failure that is
    not one, such as an admin API's HTTP answer); ``code``: its name, or that
    failure's own word (``HTTP_503``, ``BAD_DISCOVERY``).
    """

    def __init__(
        self, message: str, *, code: grpc.StatusCode | str = grpc.StatusCode.UNKNOWN,
        reason: str = "",
    ) -> None:  # fmt: skip
        if isinstance(code, str) and code in grpc.StatusCode.__members__:
            raise TypeError(f"a gRPC status is a grpc.StatusCode, not its name {code!r}")
        super().__init__(message)
        self.status = code if isinstance(code, grpc.StatusCode) else None
        self.code = code.name if isinstance(code, grpc.StatusCode) else code
        self.reason = reason or message


class WriteNotApplied(BackendError):
    """The node refused the write and applied none of it (its write-ahead log failed):
    sending it again later, or to the restarted node, is safe."""

    applied = False


class WriteAppliedNotDurable(BackendError):
    """The node applied the write in memory but could not make it durable, and stopped
    accepting writes. Do not resend it: it is applied (and lost if the node restarts
    before it resumes)."""

    applied = True


class TableNotInitialized(BackendError):
    """The table is unknown to this client or to the backend."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message, code=grpc.StatusCode.NOT_FOUND, reason=reason)


class TableShapeMismatch(TypeError):
    """``init_data`` met an existing table with another shape or dtype."""


class IdOutOfRange(InvalidArgument, IndexError, RuntimeError):
    """An id outside a dense table's rows.

    torch raises IndexError for it in ``F.embedding`` and RuntimeError in
    ``F.embedding_bag``; this is both, and RecStore's InvalidArgument.
    """


class IdDtypeError(InvalidArgument, RuntimeError):
    """Ids of a dtype torch.nn refuses (anything but int32/int64): torch's RuntimeError."""
