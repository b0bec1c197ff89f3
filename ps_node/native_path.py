"""MultiPull and MultiUpdate served by the engine in one native pass, when it can.

The Python path (``recstore.ps.multi`` behind the servicer) costs several
times the engine work of a training step's request: decoding, per-item
checks, framing. ``recstore._native.serve_multi`` does the same checks and the
same work on the request bytes and returns the reply the Python path would
frame. It *declines* whatever it does not handle, or would refuse, touching
nothing, and the Python path then serves the request as before (so every
error keeps its exact status and message): read-only pulls, tables on a GPU
or with an injected clock, write-ahead logging, and any request with
something to refuse. Here: resolve the named tables, hold the write locks of
the updated ones (in name order, as ``multi.multi_update``), call the engine.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from recstore import _native as _native_module
from recstore.core import CapacityExhausted, InvalidArgument
from recstore.ps.multi import CarriedUpdatesApplied
from recstore.ps.node import HostedTable, Node

#: the compiled engine (no type stubs: it takes raw buffer addresses)
_native: Any = _native_module


@dataclass(frozen=True)
class Served:
    """A natively served request: the reply, and which tables moved how many rows."""

    reply: bytes
    pulled: list[tuple[str, int]]  # (table, rows) per pull item
    updated: list[tuple[str, int]]  # (table, rows) per update


def _view(name: str, hosted: HostedTable) -> tuple[Any, ...] | None:
    engine = hosted.table.host_engine
    if engine is None or hosted.wal is not None:
        return None
    owned = hosted.owned_slots
    address = 0 if owned is None else owned.ctypes.data  # bool per slot, kept alive by hosted
    return (name, engine, address, float(hosted.entry.spec.optimizer.lr), hosted.dtype)


def serve(node: Node, method: str, request: bytes) -> Served | None:
    """Serve ``request`` natively; None when declined (the Python path serves it)."""
    try:
        pull_tables, update_tables = _native.multi_item_tables(method, request)
    except ValueError:
        return None  # malformed: the Python decoder words the error
    hosted: dict[str, HostedTable] = {}
    views = []
    for name in dict.fromkeys([*pull_tables, *update_tables]):
        table = node.tables.get(name)
        view = None if table is None else _view(name, table)
        if table is None or view is None:
            return None
        hosted[name] = table
        views.append(view)
    with contextlib.ExitStack() as locks:
        for name in sorted(set(update_tables)):  # one global order, as multi.multi_update
            locks.enter_context(hosted[name].lock)
            if node.tables.get(name) is not hosted[name]:  # dropped or reloaded meanwhile
                return None
        result = _native.serve_multi(method, request, views)
    if result[0] is None:
        if len(result) == 2:
            return None  # declined
        _, message, capacity, updates_applied = result
        if updates_applied and update_tables and method == "MultiPull":
            raise CarriedUpdatesApplied(
                f"the {len(update_tables)} carried updates were applied, the pulls failed: "
                f"{message}"
            )
        raise (CapacityExhausted if capacity else InvalidArgument)(message)
    reply, pull_rows, update_rows = result
    return Served(
        reply,
        list(zip(pull_tables, pull_rows, strict=True)),
        list(zip(update_tables, update_rows, strict=True)),
    )
