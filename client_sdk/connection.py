"""Which backend a client talks to, decided from explicit calls and the environment.

No configuration at all means the local backend (the native store in this
process). ``RECSTORE_PS_ENDPOINTS`` (``host:port`` list in shard order) or
``RECSTORE_ADMIN_URL`` (discovery through the admin API, token in
``RECSTORE_TOKEN``) select the gRPC backend; ``set_ps_config`` /
``set_ps_endpoints`` / ``set_admin_url`` / ``set_ps_backend`` override them.
The PS nodes' token is ``set_admin_url``'s or ``set_ps_endpoints``'s
``ps_token``, else ``RECSTORE_PS_TOKEN`` (read by the gRPC backend).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from recstore.client.remote.tables import ADMIN_URL_ENV, ENDPOINTS_ENV, TOKEN_ENV, parse_endpoints
from recstore.core import DType

BACKENDS = ("local", "grpc")


@dataclass(frozen=True)
class Connection:
    backend: str  # "local" or "grpc"
    endpoints: tuple[str, ...] | None = None
    admin_url: str | None = None
    token: str | None = None
    #: float32 tables' rows and gradients on the wire (None: each spec's transport_dtype)
    transport_dtype: str | None = None
    #: the PS nodes' bearer token, never sent to the admin API (None: RECSTORE_PS_TOKEN)
    ps_token: str | None = None

    @property
    def configured(self) -> bool:
        """The gRPC backend knows where its nodes are (always true for local)."""
        return self.backend == "local" or bool(self.endpoints or self.admin_url)

    def describe(self) -> str:
        if self.backend == "local":
            return "local (native store in this process)"
        if self.endpoints:
            return f"grpc ({', '.join(self.endpoints)})"
        if self.admin_url:
            return f"grpc (discovery via {self.admin_url})"
        return "grpc (no endpoints configured)"


def from_environment(environ: Mapping[str, str] | None = None) -> Connection:
    env = os.environ if environ is None else environ
    raw_endpoints = env.get(ENDPOINTS_ENV, "").strip()
    admin_url = env.get(ADMIN_URL_ENV, "").strip() or None
    token = env.get(TOKEN_ENV, "").strip() or None
    endpoints = parse_endpoints(raw_endpoints) if raw_endpoints else None
    backend = "grpc" if endpoints or admin_url else "local"
    return Connection(backend, endpoints, admin_url, token)


def with_backend(connection: Connection, backend: str) -> Connection:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    return replace(connection, backend=backend)


def with_endpoints(
    connection: Connection,
    endpoints: str | list[str] | tuple[str, ...],
    ps_token: str | None = None,
) -> Connection:
    """Explicit shard endpoints win over admin discovery."""
    return replace(
        connection,
        backend="grpc",
        endpoints=parse_endpoints(endpoints),
        admin_url=None,
        ps_token=ps_token or connection.ps_token,
    )


def with_admin(
    connection: Connection, admin_url: str, token: str | None, ps_token: str | None = None
) -> Connection:
    if not admin_url.startswith(("http://", "https://")):
        raise ValueError(f"admin URL must start with http:// or https://, got {admin_url!r}")
    return replace(
        connection,
        backend="grpc",
        endpoints=None,
        admin_url=admin_url.rstrip("/"),
        token=token or connection.token,
        ps_token=ps_token or connection.ps_token,
    )


def with_transport(connection: Connection, dtype: str | None) -> Connection:
    """float32 tables' rows travel as ``dtype`` (float16/bfloat16; None: as each spec says)."""
    if dtype is not None:
        dtype = DType(dtype).value  # ValueError names the dtypes a table has
    return replace(connection, transport_dtype=dtype)
