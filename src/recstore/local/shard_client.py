"""A provisioner's view of one PS node: is it serving a table, and save it.

The local provisioner polls this for readiness and sizes and calls Save for
requested checkpoints; it never touches rows, so it needs only the control
calls (``recstore.core.control``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from recstore.core.checkpoint_status import ShardCheckpoint, clip
from recstore.core.control import CREATE_REFUSALS, ControlClient, ControlError
from recstore.core.limits import grpc_options
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec
from recstore.core.tls import ClientTls
from recstore.core.tls import channel as tls_channel


class TableRefused(RuntimeError):
    """A serving node refused to host a table; ``reason`` is the node's own words."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"{endpoint}: {reason}")
        self.endpoint, self.reason = endpoint, reason


@dataclass(frozen=True)
class ShardStats:
    rows: int
    memory_bytes: int
    #: the map the node routes by (after an offline reshard, not the one it was created with)
    slot_map: SlotMap | None


class ShardClient:
    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        timeout: float = 1.0,
        tls: ClientTls | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._timeout = timeout
        self._channel = tls_channel(endpoint, tls, grpc_options())
        self._control = ControlClient(endpoint, token=token, timeout=timeout, channel=self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def serving(self) -> bool:
        """The node answers and serves (its health says SERVING): a pool's node holding no
        table yet is ready for one."""
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(), timeout=self._timeout)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def drop_table(self, table: str) -> bool:
        """Drop ``table`` from the node (its rows and memory go): True when the node no longer
        holds it, False when the node could not be asked."""
        try:
            self._control.drop_table(table, timeout=self._timeout * 10)
        except ControlError as error:
            return error.code == grpc.StatusCode.NOT_FOUND
        return True

    def stats(self, table: str) -> ShardStats | None:
        """Rows, memory bytes and slot map of this shard of ``table``; None while not served."""
        try:
            stats = self._control.stats(table)
        except ControlError:
            return None
        return ShardStats(stats.size, stats.memory_bytes, stats.slot_map)

    def ensure_table(self, spec: TableSpec, slot_map: SlotMap | None = None) -> bool:
        """Create the table on a serving node that lacks it; True when the node has it now.

        False while the node is not serving yet; ``TableRefused`` when it answers
        that it will not host this table (retrying the same spec cannot help).
        A restarted node restores its tables by itself; this covers the first start.
        ``slot_map``: the table's map when it differs from the initial one (a new shard
        joining a table moved online owns no slot until a move gives it some).
        """
        try:
            self._control.create_table(spec, slot_map, timeout=self._timeout * 10)
        except ControlError as error:
            if error.code in CREATE_REFUSALS:
                raise TableRefused(self.endpoint, error.details) from error
            return False
        return True

    def save(
        self,
        checkpoint_id: str,
        *,
        index: int,
        tables: Sequence[str] = (),
        timeout: float = 600.0,
    ) -> ShardCheckpoint:
        """Write a checkpoint of ``tables`` on the node (shard ``index``; empty: every table
        it holds): what it saved, or why it did not."""
        try:
            info = self._control.save(checkpoint_id, tables=tables, timeout=timeout)
        except ControlError as error:
            return ShardCheckpoint(index=index, endpoint=self.endpoint, error=clip(str(error)))
        return ShardCheckpoint(
            index=index, endpoint=self.endpoint, rows=info.rows, bytes=info.bytes
        )

    def close(self) -> None:
        self._control.close()
        self._channel.close()
