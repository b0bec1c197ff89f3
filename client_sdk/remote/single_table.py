"""Rows over the wire: the per-shard requests of Pull, Push and Update and their replies.

Each function returns the ``issue`` callback the shard router calls once per
(shard, batch) request: it encodes that request with ``recstore.core.wire``
(keys and rows copied once, into the message), starts it on the owner node and
returns a waiter that decodes the reply (pulled rows are copied once more,
from the reply straight into the caller's output array). Replies are checked
against the table: a node answering rows of another shape or dtype is a
``BackendError`` (DATA_LOSS), never silently wrong rows.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import numpy as np

from recstore.client.errors import BackendError
from recstore.client.remote.nodes import NodeCalls
from recstore.client.remote.routing import Positions, Waiter
from recstore.core import InvalidArgument, TableSpec, wire

NodeOf = Callable[[int], NodeCalls]  # shard -> its node
Issue = Callable[[int, Positions, int, bool], Waiter[object]]


def _bad_reply(node: NodeCalls, table: str, why: str) -> BackendError:
    return BackendError(
        f"PS node {node.endpoint} answered a malformed Pull reply for table {table!r}: {why}",
        code=grpc.StatusCode.DATA_LOSS,
    )


def pull_issue(
    spec: TableSpec,
    keys: np.ndarray,
    out: np.ndarray,
    node_of: NodeOf,
    transport: str = "",
) -> Issue:
    """Requests that fill ``out[positions]`` with the rows of ``keys[positions]``.

    ``transport``: the dtype the rows travel in ("": ``out``'s), converted into ``out``.
    """
    name, dim, dtype = spec.name, spec.embedding_dim, out.dtype

    def issue(shard: int, positions: Positions, epoch: int, blocking: bool) -> Waiter[object]:
        node = node_of(shard)
        request = wire.encode_pull_request(
            name, keys[positions], epoch=epoch, value_dtype=transport
        )
        waiter = node.start("Pull", request, name, blocking=blocking)

        def finish() -> None:
            raw = waiter()
            try:
                reply = wire.decode_pull_response(raw)
                rows = wire.reply_rows(reply, len(positions), dim, transport, dtype)
            except InvalidArgument as error:
                raise _bad_reply(node, name, str(error)) from error
            out[positions] = rows

        return finish

    return issue


def push_issue(spec: TableSpec, keys: np.ndarray, values: np.ndarray, node_of: NodeOf) -> Issue:
    name, dim, dtype = spec.name, spec.embedding_dim, wire.dtype_name(values)

    def issue(shard: int, positions: Positions, epoch: int, blocking: bool) -> Waiter[object]:
        request = wire.encode_push_request(
            name, keys[positions], values[positions], epoch=epoch, dtype=dtype, dim=dim
        )
        return node_of(shard).start("Push", request, name, blocking=blocking)

    return issue


def update_issue(
    spec: TableSpec,
    keys: np.ndarray,
    grads: np.ndarray,
    lr: float | None,
    node_of: NodeOf,
    transport: str = "",
) -> Issue:
    """Requests of ``grads``, sent as ``transport`` ("": as they are)."""
    name, dim = spec.name, spec.embedding_dim
    grad_dtype = transport or wire.dtype_name(grads)

    def issue(shard: int, positions: Positions, epoch: int, blocking: bool) -> Waiter[object]:
        sent = wire.as_wire_dtype(grads[positions], grad_dtype)
        request = wire.encode_update_request(
            name, keys[positions], sent, epoch=epoch, grad_dtype=grad_dtype, dim=dim, lr=lr,
        )  # fmt: skip
        return node_of(shard).start("Update", request, name, blocking=blocking)

    return issue
