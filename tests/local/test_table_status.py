"""A node's refusal to host a table is shown only while it holds.

A stats call that fails for a moment (a timeout on a busy machine) makes the
poller ask a node that does hold the table to create it; during a move the
node's spec is not the provisioner's, so the node refuses. Once every shard
serves the table again, that refusal must not keep the table from Ready.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recstore.core import TableSpec
from recstore.local import table_status
from recstore.local.shard_client import ShardStats, TableRefused
from recstore.local.table import LocalTable


class FlakyShard:
    """A node holding the table whose next ``failures`` stats calls fail."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.create_calls = 0

    def stats(self, table: str) -> ShardStats | None:
        if self.failures:
            self.failures -= 1
            return None
        return ShardStats(rows=10, memory_bytes=100, slot_map=None)

    def ensure_table(self, spec: TableSpec, slot_map: Any = None) -> bool:
        self.create_calls += 1
        raise TableRefused("127.0.0.1:1", f"table {spec.name!r} exists with a different spec")


class Reporter:
    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []

    def register_node(self, table: str, shard: int, endpoint: str, metrics: str) -> int:
        return shard + 1

    def heartbeat(self, node_id: int, ready: bool, rows: int, memory_bytes: int) -> None:
        pass

    def report_status(self, table: str, status: dict[str, Any]) -> None:
        self.statuses.append(status)


def _table(tmp_path: Path, shards: list[FlakyShard]) -> LocalTable:
    spec = TableSpec(name="t", num_embeddings=100, embedding_dim=4, shards=len(shards))
    ports = [(1000 + i, 2000 + i) for i in range(len(shards))]
    return LocalTable(spec, tmp_path, ports, shards, [None] * len(shards))  # type: ignore[arg-type]


def test_a_refusal_after_a_failed_stats_call_is_forgotten_once_the_node_serves(
    tmp_path: Path,
) -> None:
    shards = [FlakyShard(), FlakyShard(failures=1)]
    table, reporter = _table(tmp_path, shards), Reporter()
    table_status.report(table, reporter, now=0.0)
    assert shards[1].create_calls == 1
    assert table.refused is not None and reporter.statuses[-1]["phase"] != "Ready"

    table_status.report(table, reporter, now=1.0)
    assert table.refused is None and table.refused_reason is None
    assert reporter.statuses[-1]["phase"] == "Ready"


def test_a_refusal_stays_while_the_node_does_not_serve_the_table(tmp_path: Path) -> None:
    shards = [FlakyShard(), FlakyShard(failures=10)]
    table, reporter = _table(tmp_path, shards), Reporter()
    for now in (0.0, 100.0):
        table_status.report(table, reporter, now=now)
    assert table.refused is not None and reporter.statuses[-1]["phase"] != "Ready"
