"""Where a client's tables live: the native store in this process, or PS nodes over gRPC."""

from recstore.client.backends.base import Backend, CreateResult

__all__ = ["Backend", "CreateResult"]
