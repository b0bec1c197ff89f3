"""Who may call what on a node: the bearer-token rules, applied by its native server.

Kubernetes probes and grpcurl discovery carry no token, so ``grpc.health.v1``
and server reflection stay open; everything else needs
``authorization: Bearer <token>`` when the node has a token configured.

A node may also have a read-only token (``--read-only-token-file``), for the
nodes that serve a trained model: its holders may read (``READ_ONLY_METHODS``:
Pull, MultiPull without carried updates, ExportRows, ListTables,
GetTableStats, ListCheckpoints, and CacheReport: a serving process's host
cache reports its counters, which changes no table) and get PERMISSION_DENIED, with nothing
changed, for every other RPC (Push, Update, MultiUpdate, ImportRows,
CreateTable, DropTable, Save, Load, RecoverTable).

The rules are data here and checks in ``csrc/node_server.cc``: the token is
checked on the call's metadata, on gRPC's threads, before the request is read,
so the body of an unauthenticated call (however large) is never received whole;
HTTP/2 flow control keeps what is in flight to a window, and the stream is
reset when the status goes out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recstore import _native as _native_module
from recstore.ps.serve.native_server import Access

OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
SERVICE_PREFIX = "/recstore.v1.ParameterServer/"
#: what a read-only token may call (MultiPull only when it carries no updates)
READ_ONLY_METHODS = frozenset(
    {"Pull", "MultiPull", "ExportRows", "ListTables", "GetTableStats", "ListCheckpoints",
     "CacheReport"}
)  # fmt: skip
READ_ONLY_REFUSAL = "a read-only token may not call {method}: it reads, never writes"

#: the compiled engine (no type stubs): the native server's checks
_native: Any = _native_module


def read_token_file(path: Path) -> str:
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"auth token file {path} is empty")
    return token


def is_authorized(metadata: Any, token: str) -> bool:
    """True when the metadata carries ``authorization: Bearer <token>`` (the server's check)."""
    return bool(_native.bearer_matches(list(metadata or ()), token))


def access(token: str | None, read_only_token: str | None = None) -> Access:
    """The rules of a node with these tokens (no token: every call is admitted)."""
    return Access(
        token=token,
        read_only_token=read_only_token,
        open_prefixes=OPEN_PREFIXES,
        service_prefix=SERVICE_PREFIX,
        read_only_methods=READ_ONLY_METHODS,
        read_only_refusal=READ_ONLY_REFUSAL,
    )
