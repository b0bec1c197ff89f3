"""Whether a shard serves a table during a move (``recstore.local.resharding.shard_serves``).

A node killed mid-move restores its tables by itself, and its first answers can
come before it has: the stats call finds no table, the create that follows meets
the restored one, whose spec still has the shard count from before the move.
That shard serves the table; a refusal with no table there stays a refusal.
(Seen once in a fresh clone: the resharder thread stopped on "exists with a
different spec" and the move never finished.)
"""

from __future__ import annotations

from typing import Any

import pytest

from recstore.core import SlotMap, TableSpec
from recstore.local.resharding import shard_serves
from recstore.local.shard_client import TableRefused

SPEC = TableSpec(name="t", num_embeddings=100, embedding_dim=4, shards=3)


class Node:
    """A shard client whose answers are scripted: stats one by one, then the create."""

    def __init__(self, stats: list[Any], create: bool | Exception) -> None:
        self.stats_answers, self.create = list(stats), create
        self.calls: list[str] = []

    def stats(self, name: str) -> Any:
        self.calls.append("stats")
        return self.stats_answers.pop(0)

    def ensure_table(self, spec: TableSpec, slot_map: SlotMap | None = None) -> bool:
        self.calls.append("create")
        if isinstance(self.create, Exception):
            raise self.create
        return self.create


REFUSED = TableRefused("127.0.0.1:1", "table 't' exists with a different spec")


@pytest.mark.parametrize(
    ("stats", "create", "serves", "calls"),
    [
        (["hosted"], True, True, ["stats"]),  # the table is there
        ([None], True, True, ["stats", "create"]),  # created now
        ([None], False, False, ["stats", "create"]),  # not serving yet
        ([None, "hosted"], REFUSED, True, ["stats", "create", "stats"]),  # restored meanwhile
    ],
)
def test_a_shard_serves_the_table_it_hosts(
    stats: list[Any], create: bool | Exception, serves: bool, calls: list[str]
) -> None:
    node = Node(stats, create)
    assert shard_serves(node, SPEC, SlotMap.initial(3)) is serves  # type: ignore[arg-type]
    assert node.calls == calls


def test_a_refusal_with_no_table_there_is_final() -> None:
    node = Node([None, None], REFUSED)
    with pytest.raises(TableRefused):
        shard_serves(node, SPEC, SlotMap.initial(3))  # type: ignore[arg-type]
