"""A table's version (PullResponse.version, TableStats.version): moves on every write only.

A client cache keeps rows read at a version and drops them when a node reports
another, so every write path must move it and a pull must report the version
read before its rows.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from recstore.core import wire
from recstore.v1 import ps_pb2

from .conftest import Client, spec


def _pull_version(client: Client, table: str, keys: list[int]) -> int:
    keys_bytes = np.asarray(keys, dtype="<i8").tobytes()
    reply = client.call("Pull", ps_pb2.PullRequest(table=table, keys=keys_bytes))
    # the generated class and the hand-laid decoder read the same field
    raw = wire.decode_pull_response(reply.SerializeToString())
    assert raw.version == reply.version
    return int(reply.version)


def _stats_version(client: Client, table: str) -> int:
    return int(client.call("GetTableStats", ps_pb2.GetTableStatsRequest(table=table)).version)


def test_every_write_moves_the_version_and_pulls_do_not(client: Client) -> None:
    client.create(spec())
    first = _pull_version(client, "emb", [1, 2])
    assert first > 0
    assert _pull_version(client, "emb", [3]) == first == _stats_version(client, "emb")
    client.push("emb", [1], np.ones((1, 8), np.float32))
    pushed = _pull_version(client, "emb", [1])
    assert pushed > first and _stats_version(client, "emb") == pushed
    client.update("emb", [2], np.ones((1, 8), np.float32))
    updated = _pull_version(client, "emb", [])
    assert updated > pushed
    multi = ps_pb2.MultiUpdateRequest(
        items=[
            ps_pb2.UpdateRequest(
                table="emb",
                keys=np.asarray([4], "<i8").tobytes(),
                grads=np.ones((1, 8), np.float32).tobytes(),
            )
        ]
    )
    client.call("MultiUpdate", multi)
    assert _pull_version(client, "emb", [4]) > updated


def test_a_table_created_again_never_reports_an_older_version(client: Client) -> None:
    client.create(spec())
    client.push("emb", [1], np.ones((1, 8), np.float32))
    before = _stats_version(client, "emb")
    client.call("DropTable", ps_pb2.DropTableRequest(table="emb"))
    client.create(spec())
    assert _stats_version(client, "emb") > before


def test_a_refused_write_leaves_the_version(client: Client) -> None:
    client.create(spec())
    before = _stats_version(client, "emb")
    request = ps_pb2.PushRequest(
        table="emb", keys=np.asarray([1], "<i8").tobytes(), values=b"\0" * 4
    )
    with pytest.raises(grpc.RpcError) as info:
        client.call("Push", request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _stats_version(client, "emb") == before
