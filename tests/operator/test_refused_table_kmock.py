"""A table its node refuses shows so in the EmbeddingTable's status, and stops when it is over.

A real WAL node on loopback takes acknowledged updates and stops as a crash stops it;
one bit of its log is flipped with intact records after it, and the node starts again
(the pod's restart count goes up): it refuses the table rather than serve a state that
never existed. The operator, asking the restarted shard to host the table, gets that
refusal and writes it to the status: phase Failed, Ready False with reason NodeRefused
and the node's own words (segment and offset). Once the loss is accepted on the node,
the next refresh finds the table served again and the table is Ready.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from recstore.core.control import ControlClient, recover_table_rpc
from recstore.local.ports import free_port
from recstore.operator.config import OperatorConfig
from recstore.ps.serve.server import ServerHandle, start_in_thread
from recstore.ps.wal import records as wal
from recstore.ps.wal.scan import record_starts
from recstore.ps.wal.segments import generations, segment_path
from recstore.v1 import ps_pb2, ps_pb2_grpc

from .cluster_objects import MERGE, PODS, STS, condition, get, run_shards, status_of, table
from .conftest import ET, PS_TOKEN, ApiServer, running_operator, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SPEC = {"name": "clicks", "numEmbeddings": 100, "embeddingDim": 8, "shards": 1,
        "checkpoint": {"durability": "wal"}}  # fmt: skip
UPDATES = 40


def start(data_dir: Path, port: int) -> ServerHandle:
    return start_in_thread(
        "127.0.0.1",
        port,
        data_dir=data_dir,
        shard_index=0,
        num_shards=1,
        durability="wal",
        auth_token=PS_TOKEN,
    )


def update(address: str, key: int) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        request = ps_pb2.UpdateRequest(
            table="clicks",
            keys=np.array([key], "<i8").tobytes(),
            grads=np.full((1, 8), 0.5, "<f4").tobytes(),
        )
        stub.Update(request, metadata=(("authorization", f"Bearer {PS_TOKEN}"),), timeout=10)


def flip_a_middle_record(data_dir: Path) -> None:
    """One bit of a record in the middle of the newest segment: intact records follow it."""
    (directory,) = (data_dir / "wal").glob("clicks-*")
    path = segment_path(directory, generations(directory)[-1])
    data = bytearray(path.read_bytes())
    starts = record_starts(bytes(data))
    assert len(starts) > UPDATES // 2
    data[starts[len(starts) // 2] + wal.FRAME.size + 4] ^= 0x01
    path.write_bytes(bytes(data))


async def restarted(api: httpx.AsyncClient, count: int) -> None:
    """The kubelet's view of the shard's container after its ``count``-th restart."""
    status = {"containerStatuses": [{"name": "ps", "restartCount": count}]}
    patched = await api.patch(f"{PODS}/clicks-ps-0/status", json={"status": status}, headers=MERGE)
    patched.raise_for_status()


async def test_a_table_its_node_refuses_is_failed_with_the_nodes_reason_until_recovered(
    api_server: ApiServer, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    port = free_port()
    config = OperatorConfig(
        ps_image="registry.example/recstore-ps:1.0", ps_token_secret="ps-token",
        status_interval=0.2, ps_port=port, rpc_timeout=5, retry_delay=0.2,
    )  # fmt: skip
    node = await asyncio.to_thread(start, tmp_path / "node", port)
    async with running_operator(api, config):
        (await api.post(ET, json=table(**SPEC))).raise_for_status()
        await wait_for(lambda: get(api, f"{STS}/clicks-ps"), what="StatefulSet")
        await run_shards(api, "clicks", 1)

        async def phase(wanted: str) -> dict[str, Any] | None:
            status = await status_of(api)
            return status if status.get("phase") == wanted else None

        await wait_for(lambda: phase("Ready"), what="Ready")
        for key in range(UPDATES):  # each acknowledged once its record is durable
            await asyncio.to_thread(update, f"127.0.0.1:{port}", key % 10)
        await asyncio.to_thread(node.stop, False)  # as a crash: no final checkpoint
        flip_a_middle_record(tmp_path / "node")
        node = await asyncio.to_thread(start, tmp_path / "node", port)
        try:
            await restarted(api, 1)
            status = await wait_for(lambda: phase("Failed"), what="Failed")
            ready = condition(status, "Ready")
            assert ready["status"] == "False" and ready["reason"] == "NodeRefused"
            assert "shard 0" in ready["message"] and "checksum mismatch" in ready["message"]
            assert ".wal, offset" in ready["message"]

            recovered = await asyncio.to_thread(_accept_log_loss, f"127.0.0.1:{port}")
            assert recovered.writes_dropped > 0 and recovered.damage
            await wait_for(lambda: phase("Ready"), what="Ready again after the recovery")
            assert condition(await status_of(api), "Ready")["reason"] != "NodeRefused"
        finally:
            await asyncio.to_thread(node.stop, False)


def _accept_log_loss(address: str) -> Any:
    with ControlClient(address, token=PS_TOKEN, timeout=30) as client:
        return client.call(recover_table_rpc("clicks", accept_log_loss=True))
