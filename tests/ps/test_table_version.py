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
from recstore.ps import native_path
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


def _multi_versions(client: Client, items: list[tuple[str, list[int], bool]]) -> list[int]:
    request = ps_pb2.MultiPullRequest(
        items=[
            ps_pb2.PullRequest(table=t, keys=np.asarray(k, "<i8").tobytes(), read_only=ro)
            for t, k, ro in items
        ]
    )
    reply = client.call("MultiPull", request)
    raw = wire.decode_multi_pull_response(reply.SerializeToString())
    assert [r.version for r in raw] == [item.version for item in reply.items]
    return [int(item.version) for item in reply.items]


@pytest.mark.parametrize("natively", [True, False], ids=["native path", "node applies"])
def test_multi_pull_items_carry_the_version_on_every_path(
    client: Client, monkeypatch: pytest.MonkeyPatch, natively: bool
) -> None:
    monkeypatch.setattr(native_path, "APPLY_NATIVELY", natively)
    client.create(spec())
    client.create(spec("other"))
    emb, other = _stats_version(client, "emb"), _stats_version(client, "other")
    assert emb != other
    items = [("emb", [1, 2], False), ("other", [3], False), ("emb", [], False)]
    assert _multi_versions(client, items) == [emb, other, emb]
    assert _multi_versions(client, [("emb", [1], True)]) == [emb]  # read-only: the node's path
    client.push("emb", [1], np.ones((1, 8), np.float32))
    pushed = _stats_version(client, "emb")
    assert pushed > emb
    assert _multi_versions(client, items) == [pushed, other, pushed]


def test_a_multi_pull_reports_the_version_from_before_its_carried_updates(
    client: Client,
) -> None:
    client.create(spec())
    before = _stats_version(client, "emb")
    update = ps_pb2.UpdateRequest(
        table="emb", keys=np.asarray([4], "<i8").tobytes(), grads=np.ones((1, 8), "<f4").tobytes()
    )
    request = ps_pb2.MultiPullRequest(
        items=[ps_pb2.PullRequest(table="emb", keys=np.asarray([4], "<i8").tobytes())],
        updates=[update],
    )
    reply = client.call("MultiPull", request)
    # the rows read the update, the version predates it: a cache that kept them drops them
    # at its next lookup (older than the rows, never newer)
    assert reply.items[0].version == before < _stats_version(client, "emb")
