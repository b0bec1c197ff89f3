"""Prometheus metrics of a node: requests, rows, latency, table sizes, memory, non-finite input.

Each node owns a registry (several in-process nodes in one test must not share
counters); table sizes are read from the engine at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from recstore.ps.checkpoint import CheckpointInfo
    from recstore.ps.node import HostedTable

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class _TableCollector(Collector):
    def __init__(self, tables: Callable[[], dict[str, HostedTable]]) -> None:
        self._tables = tables

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        rows = GaugeMetricFamily("recstore_ps_table_rows", "Rows held", labels=["table"])
        capacity = GaugeMetricFamily(
            "recstore_ps_table_capacity_rows", "Rows the shard may hold", labels=["table"]
        )
        memory = GaugeMetricFamily(
            "recstore_ps_table_memory_bytes", "Memory of the shard", labels=["table"]
        )
        skipped = CounterMetricFamily(
            "recstore_ps_nonfinite_rows_skipped",
            "Keys left out of writes for NaN or infinite values (nonFinite: skip-rows)",
            labels=["table"],
        )
        for name, hosted in sorted(self._tables().items()):
            rows.add_metric([name], hosted.table.size)
            capacity.add_metric([name], hosted.table.capacity)
            memory.add_metric([name], hosted.table.memory_bytes)
            skipped.add_metric([name], hosted.table.stats()["nonfinite_skipped"])
        yield from (rows, capacity, memory, skipped)


class Metrics:
    def __init__(self, tables: Callable[[], dict[str, HostedTable]] | None = None) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # resident memory, CPU seconds, open fds
        self.requests = Counter(
            "recstore_ps_requests",
            "RPCs handled",
            ["method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "recstore_ps_request_seconds",
            "RPC latency",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rows_moved = Counter(
            "recstore_ps_rows",
            "Rows pulled, pushed or updated",
            ["method", "table"],
            registry=self.registry,
        )
        self.nonfinite_rejected = Counter(
            "recstore_ps_nonfinite_rejected",
            "Write batches refused for NaN or infinite values (nonFinite: reject)",
            ["table"],
            registry=self.registry,
        )
        self.last_checkpoint = Gauge(
            "recstore_ps_last_checkpoint_timestamp_seconds",
            "Unix time of the last checkpoint written",
            registry=self.registry,
        )
        self.checkpoint_bytes = Gauge(
            "recstore_ps_last_checkpoint_bytes",
            "Size of the last checkpoint",
            registry=self.registry,
        )
        if tables is not None:
            self.registry.register(_TableCollector(tables))
        # Children by label values: ``labels()`` costs a lock and a few dict lookups
        # per call, several times per request on the data path. Children are never
        # removed, so a cached one stays the registered one.
        self._requests: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        self._rows: dict[tuple[str, str], Any] = {}

    def observe(self, method: str, code: str, seconds: float) -> None:
        requests = self._requests.get((method, code))
        if requests is None:
            requests = self._requests[method, code] = self.requests.labels(method, code)
        latency = self._latency.get(method)
        if latency is None:
            latency = self._latency[method] = self.latency.labels(method)
        requests.inc()
        latency.observe(seconds)

    def rows(self, table: str, method: str, count: int) -> None:
        child = self._rows.get((method, table))
        if child is None:
            child = self._rows[method, table] = self.rows_moved.labels(method, table)
        child.inc(count)

    def checkpointed(self, info: CheckpointInfo) -> None:
        self.last_checkpoint.set(info.created_unix)
        self.checkpoint_bytes.set(info.bytes)


def serve(metrics: Metrics, port: int, host: str = "0.0.0.0") -> tuple[Any, int]:
    """Serve /metrics over HTTP in a thread; returns (server, bound port)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    return server, server.server_address[1]
