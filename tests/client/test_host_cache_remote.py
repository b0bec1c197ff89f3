"""An inference table's host cache over gRPC: lookups ride on MultiPull (one request per
node), stay exact after writes by another client, count hits and misses per distinct
key, and skip nodes whose keys all hit only within ``version_check_interval``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import recstore.nve as nve
from recstore.client import RecStoreClient
from recstore.client.remote.nodes import NodeCalls

from .conftest import unique_name

ROWS, DIM = 1000, 4


class Sent:
    """Every request the SDK starts, as (method, endpoint)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        start = NodeCalls.start

        def counting(node: NodeCalls, method: str, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, node.endpoint))
            return start(node, method, *args, **kwargs)

        monkeypatch.setattr(NodeCalls, "start", counting)

    def take(self) -> list[tuple[str, str]]:
        calls, self.calls = self.calls, []
        return sorted(calls)


@pytest.fixture
def other_client(ps_endpoints: list[str]) -> Iterator[RecStoreClient]:
    """A second client of the same nodes: its writes are not this client's."""
    client = RecStoreClient(role=unique_name("other"))
    client.set_ps_endpoints(ps_endpoints)
    yield client
    client.close()


def _layer(
    client: RecStoreClient, name: str, other: RecStoreClient | None = None, **config: Any
) -> nve.NVEmbedding:
    layer = nve.NVEmbedding(
        ROWS, DIM, storage=nve.RemoteTable(client, name), device="cpu",
        optimize_for_training=False, config={"host_cache_size": 1 << 16, **config},
    )  # fmt: skip
    if other is not None:  # the other client opens the table the layer created
        other.init_data(name, (ROWS, DIM), torch.float32)
    return layer


def _keys_on_both_nodes(client: RecStoreClient, name: str) -> torch.Tensor:
    """Keys of ``name`` owned by each of its two nodes (one each, then more)."""
    table = client._backend()._locate(name)  # type: ignore[attr-defined]
    owners = table.router.slot_map.owner_table()
    from recstore.core import slot_of

    keys = torch.arange(ROWS)
    shards = owners[slot_of(keys.numpy())]
    return torch.cat([keys[shards == 0][:3], keys[shards == 1][:3]])


def test_lookups_ride_on_one_multi_pull_per_node(
    grpc_client: RecStoreClient, ps_endpoints: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique_name()
    layer = _layer(grpc_client, name)
    keys = _keys_on_both_nodes(grpc_client, name)
    sent = Sent(monkeypatch)
    first = layer(keys)
    expected = sorted(("MultiPull", e) for e in ps_endpoints)
    assert sent.take() == expected
    again = layer(keys[:1])  # every key hits: each node is still asked for its version
    assert sent.take() == expected
    torch.testing.assert_close(again, first[:1])
    assert layer.cache_stats()["hits"] == 1


def test_a_write_by_another_client_is_seen_by_the_next_lookup(
    grpc_client: RecStoreClient, other_client: RecStoreClient
) -> None:
    name = unique_name()
    layer = _layer(grpc_client, name, other_client)
    keys = _keys_on_both_nodes(grpc_client, name)
    layer(keys)
    layer(keys)
    assert layer.cache_stats()["hits"] == len(keys)
    for written in (keys[0], keys[-1]):  # a write on either node
        other_client.push(name, written.view(1), torch.full((1, DIM), float(written)))
        rows = layer(keys)  # every key was cached: the versions say they are not current
        torch.testing.assert_close(rows, other_client.pull(name, keys))
    stats = layer.cache_stats()
    assert stats["invalidations"] == 2
    # the lookups that found the cache stale count every key as a miss
    assert (stats["hits"], stats["misses"]) == (len(keys), 3 * len(keys))
    torch.testing.assert_close(layer(keys), other_client.pull(name, keys))
    assert layer.cache_stats()["hits"] == 2 * len(keys)


def test_hits_and_misses_count_each_distinct_key_once(grpc_client: RecStoreClient) -> None:
    layer = _layer(grpc_client, unique_name())
    keys = torch.tensor([[7, 7, 8], [900, 8, 7]])
    first = layer(keys)
    assert (layer.cache_stats()["hits"], layer.cache_stats()["misses"]) == (0, 3)
    second = layer(keys)
    assert (layer.cache_stats()["hits"], layer.cache_stats()["misses"]) == (3, 3)
    torch.testing.assert_close(second, first)
    torch.testing.assert_close(first[0, 0], first[1, 2])  # one row per key, everywhere


def test_version_check_interval_skips_nodes_within_its_bound_only(
    grpc_client: RecStoreClient,
    other_client: RecStoreClient,
    ps_endpoints: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = unique_name()
    layer = _layer(grpc_client, name, other_client, version_check_interval=10.0)
    assert layer._cached is not None
    now = [0.0]
    layer._cached.freshness.clock = lambda: now[0]
    keys = _keys_on_both_nodes(grpc_client, name)
    sent = Sent(monkeypatch)
    before = layer(keys)  # t = 0: every node asked, every version confirmed
    assert len(sent.take()) == 2
    now[0] = 1.0
    torch.testing.assert_close(layer(keys), before)
    assert sent.take() == []  # every key hit, every node confirmed less than 10 s ago
    now[0] = 2.0
    other_client.push(name, keys[:1], torch.full((1, DIM), 5.0))  # acknowledged at t = 2
    sent.take()
    now[0] = 9.5
    torch.testing.assert_close(layer(keys), before)  # within the bound: may be stale, is
    assert sent.take() == []
    now[0] = 10.0  # confirmed 10 s ago: asked again, the write is seen (bound: by t = 12)
    after = layer(keys)  # the check, then the batch read again once the cache was dropped
    assert sent.take() == sorted(("MultiPull", e) for e in ps_endpoints for _ in range(2))
    torch.testing.assert_close(after, other_client.pull(name, keys))
    assert float(after[0, 0]) == 5.0
    assert layer.cache_stats()["invalidations"] == 1


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "1", True])
def test_a_bad_version_check_interval_is_refused(local_client: RecStoreClient, bad: object) -> None:
    with pytest.raises(ValueError, match=r"config\['version_check_interval'\] must be a finite"):
        _layer(local_client, unique_name(), version_check_interval=bad)
    assert local_client.data_name_list() == []
