"""A provisioner's view of one PS node: is it serving a table, and save it.

The local provisioner polls this for readiness and sizes and calls Save for
requested checkpoints; it never touches rows, so it needs only the stubs.
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from recstore.core.spec import TableSpec
from recstore.v1 import ps_pb2, ps_pb2_grpc


class ShardClient:
    def __init__(self, endpoint: str, *, token: str | None = None, timeout: float = 1.0) -> None:
        self.endpoint = endpoint
        self._timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = grpc.insecure_channel(endpoint)
        self._stub = ps_pb2_grpc.ParameterServerStub(self._channel)

    def stats(self, table: str) -> tuple[int, int] | None:
        """(rows, memory bytes) of this shard of ``table``; None while not served."""
        try:
            reply = self._stub.GetTableStats(
                ps_pb2.GetTableStatsRequest(table=table),
                timeout=self._timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError:
            return None
        return int(reply.size), int(reply.memory_bytes)

    def ensure_table(self, spec: TableSpec) -> bool:
        """Create the table on a serving node that lacks it; True when the node has it now.

        A restarted node restores its tables by itself; this covers the first start.
        """
        try:
            self._stub.CreateTable(
                ps_pb2.CreateTableRequest(spec_json=json.dumps(spec.to_wire())),
                timeout=self._timeout * 10,
                metadata=self._metadata,
            )
        except grpc.RpcError:
            return False
        return True

    def save(self, checkpoint_id: str, *, timeout: float = 600.0) -> dict[str, Any]:
        """Write a checkpoint of every table on the node; raises RuntimeError on failure."""
        try:
            reply = self._stub.Save(
                ps_pb2.SaveRequest(checkpoint_id=checkpoint_id),
                timeout=timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            reason = error.details()
            raise RuntimeError(f"checkpoint on {self.endpoint} failed: {reason}") from error
        info = reply.checkpoint
        return {"endpoint": self.endpoint, "checkpointId": info.checkpoint_id, "rows": info.rows}

    def close(self) -> None:
        self._channel.close()
