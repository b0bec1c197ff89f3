"""Which table a ``torch.ops.recstore`` call means: handles, resolved at run time.

An op's schema holds strings and tensors, not a client object, so a table is
named by a handle, ``"<client role>/<table name>"``; the op's kernel finds the
client and table through this registry. Modules register theirs when they are
built; ``recstore.export`` registers the handles a saved program was traced
with, pointing at the rows it brings along (read-only) or at a live table.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from recstore.client.client import RecStoreClient


@dataclass(frozen=True)
class TableRef:
    client: RecStoreClient
    name: str
    read_only: bool = False  # a serving copy: lookups only


_tables: dict[str, TableRef] = {}
_lock = threading.Lock()


def handle_of(client: RecStoreClient, name: str) -> str:
    return f"{client.role}/{name}"


def register(client: RecStoreClient, name: str, *, handle: str | None = None,
             read_only: bool = False) -> str:  # fmt: skip
    """Make ``handle`` (default ``handle_of(client, name)``) mean this table; returns it."""
    handle = handle or handle_of(client, name)
    with _lock:
        _tables[handle] = TableRef(client, name, read_only)
    return handle


def unregister(handle: str) -> None:
    with _lock:
        _tables.pop(handle, None)


def resolve(handle: str) -> TableRef:
    with _lock:
        ref = _tables.get(handle)
    if ref is None:
        raise RuntimeError(
            f"no RecStore table is registered under {handle!r}: build the module (or "
            "recstore.export.load the package) in this process first"
        )
    return ref


def writable(handle: str) -> TableRef:
    """``resolve`` for a call that changes rows; a serving copy refuses it."""
    ref = resolve(handle)
    if ref.read_only:
        raise RuntimeError(
            f"table {ref.name!r} ({handle!r}) is a read-only serving copy: it takes no "
            "updates, writes or max_norm renormalisation"
        )
    return ref


def layout(handle: str) -> tuple[int, torch.dtype]:
    """(embedding_dim, dtype) of the table: what a shape-only kernel needs."""
    ref = resolve(handle)
    dtype, (_, dim) = ref.client.get_data_meta(ref.name)
    return dim, dtype
