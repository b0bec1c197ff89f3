"""Prometheus metrics of a node: requests, rows, latency, table sizes, memory, log faults,
non-finite input, and the caches in front of its tables.

Each node owns a registry (several in-process nodes in one test must not share
counters); table sizes are read from the engine and the write-ahead log's
state from the node's write gate at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from recstore.core.cache_figures import ClientCache
    from recstore.core.errors import CheckpointCorrupt
    from recstore.ps.checkpoint.write import CheckpointInfo
    from recstore.ps.hosted_table import HostedTable
    from recstore.ps.tables import Refusal
    from recstore.ps.wal.write_gate import WriteGate

#: The gpu_cache tier's stats (Table.stats() keys) as metric families: whether a
#: counter, and the help text. Only tables with a cache report them.
CACHE_METRICS = {
    "cache_hits": (True, "Looked-up keys the GPU cache held"),
    "cache_misses": (True, "Looked-up keys read from host memory"),
    "cache_evictions": (True, "Cached rows replaced by other keys"),
    "cache_resident_rows": (False, "Rows the GPU cache holds"),
    "cache_resident_bytes": (False, "Bytes of the rows the GPU cache holds"),
    "cache_bytes": (False, "GPU memory of the cache (rows and directory)"),
    "cache_hit_rate": (False, "Share of looked-up keys the GPU cache held"),
}

#: The caches clients report (CacheReport) as metric families, labelled by table,
#: client, layer, tier (host | gpu) and policy: whether a counter, and the help text.
#: Every node of a table holds the same reports, so sum over clients of one node, never
#: over nodes; nor over tiers (a GPU tier's misses are its host tier's lookups).
CLIENT_CACHE_METRICS = {
    "hits": (True, "Looked-up keys a client's cache tier held"),
    "misses": (True, "Looked-up keys a client's cache tier read from the tier below"),
    "evictions": (True, "Rows a client's cache tier replaced by other keys"),
    "resident_rows": (False, "Rows a client's cache tier holds"),
    "resident_bytes": (False, "Bytes of the rows a client's cache tier holds"),
    "capacity_bytes": (False, "Bytes a client's cache tier allocated"),
    "hit_rate": (False, "Share of looked-up keys a client's cache tier held"),
    "reported_timestamp_seconds": (False, "Unix time of the client's last cache report"),
}
CLIENT_CACHE_LABELS = ["table", "client", "layer", "tier", "policy"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class _TableCollector(Collector):
    def __init__(
        self,
        tables: Callable[[], dict[str, HostedTable]],
        refused: Callable[[], dict[str, Refusal]],
        client_caches: Callable[[str], list[ClientCache]] = lambda _: [],
    ) -> None:
        self._tables = tables
        self._refused = refused
        self._client_caches = client_caches

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
        cache = {
            key: (CounterMetricFamily if counter else GaugeMetricFamily)(
                f"recstore_ps_table_{key}", text, labels=["table"]
            )
            for key, (counter, text) in CACHE_METRICS.items()
        }
        clients = {
            key: (CounterMetricFamily if counter else GaugeMetricFamily)(
                f"recstore_ps_table_client_cache_{key}", text, labels=CLIENT_CACHE_LABELS
            )
            for key, (counter, text) in CLIENT_CACHE_METRICS.items()
        }
        for name, hosted in sorted(self._tables().items()):
            stats = hosted.table.stats()
            rows.add_metric([name], hosted.table.size)
            capacity.add_metric([name], hosted.table.capacity)
            memory.add_metric([name], hosted.table.memory_bytes)
            skipped.add_metric([name], stats["nonfinite_skipped"])
            for key, family in cache.items():
                if key in stats:
                    family.add_metric([name], stats[key])
            for reported in self._client_caches(name):
                values = {**reported.figures.as_dict(),
                          "reported_timestamp_seconds": reported.reported_unix}  # fmt: skip
                for key, family in clients.items():
                    family.add_metric(
                        [name, reported.client, reported.layer, reported.tier, reported.policy],
                        values[key],
                    )
        unrecoverable = GaugeMetricFamily(
            "recstore_ps_table_unrecoverable",
            "1 for a table the node refuses to serve: nothing valid restored it",
            labels=["table"],
        )
        for name in sorted(self._refused()):
            unrecoverable.add_metric([name], 1)
        yield from (rows, capacity, memory, skipped, unrecoverable, *cache.values())
        yield from clients.values()


class _WriteGateCollector(Collector):
    """Whether writes are stopped, the fault that stopped them, the faults seen."""

    def __init__(self, gate: WriteGate) -> None:
        self._gate = gate

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        fault = self._gate.fault
        yield GaugeMetricFamily(
            "recstore_ps_writes_stopped",
            "1 while the node refuses writes after a write-ahead log failure",
            value=0 if fault is None else 1,
        )
        condition = GaugeMetricFamily(
            "recstore_ps_wal_fault_since_timestamp_seconds",
            "Unix time of the log failure that stopped writes (absent while writes are accepted)",
            labels=["table", "operation", "errno", "error"],
        )
        if fault is not None:
            labels = [fault.table, fault.operation, fault.errno_name, fault.error]
            condition.add_metric(labels, fault.since)
        yield condition
        faults = CounterMetricFamily(
            "recstore_ps_wal_faults", "Write-ahead log failures by operation", labels=["operation"]
        )
        for operation, count in sorted(self._gate.fault_counts().items()):
            faults.add_metric([operation], count)
        yield faults


class _NativeCounts(Collector):
    """Adds the server's native counts (``take``) into the node's families.

    Registered before every other collector: a registry collects in that order,
    so each scrape shows the calls answered natively up to the scrape itself."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self.take: Callable[[], tuple[list[Any], list[Any]]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.take is not None:
            self._metrics.served_natively(*self.take())
        return iter(())


class Metrics:
    def __init__(
        self,
        tables: Callable[[], dict[str, HostedTable]] | None = None,
        gate: WriteGate | None = None,
        refused: Callable[[], dict[str, Refusal]] = dict,
        client_caches: Callable[[str], list[ClientCache]] = lambda _: [],
    ) -> None:
        self.registry = CollectorRegistry()
        self._native = _NativeCounts(self)
        self.registry.register(self._native)
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
        self.checkpoint_corrupt = Counter(
            "recstore_ps_checkpoint_corrupt",
            "Damaged checkpoints met (table: the damaged table; empty: the manifest)",
            ["table"],
            registry=self.registry,
        )
        self.wal_damaged = Counter(
            "recstore_ps_wal_damaged",
            "Tables refused at start because their write-ahead log is damaged",
            ["table"],
            registry=self.registry,
        )
        if tables is not None:
            self.registry.register(_TableCollector(tables, refused, client_caches))
        if gate is not None:
            self.registry.register(_WriteGateCollector(gate))
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

    def add_native(self, take: Callable[[], tuple[list[Any], list[Any]]]) -> None:
        """Count what the server answers natively too: ``take`` returns what it served
        since it was last called (``NativeServer.fast_counts``), read at each scrape."""
        self._native.take = take

    def served_natively(self, rows: list[Any], calls: list[Any]) -> None:
        """Add calls the server answered itself: (table, method, rows) and
        (method, calls, seconds, calls per latency bucket)."""
        for table, method, count in rows:
            self.rows(table, method, count)
        for method, count, seconds, buckets in calls:
            self.requests.labels(method, "OK").inc(count)
            histogram = self.latency.labels(method)
            # prometheus_client has no bulk observe: its buckets and sum, as observe() does
            histogram._sum.inc(seconds)
            for bucket, n in zip(histogram._buckets, buckets, strict=True):
                if n:
                    bucket.inc(n)

    def rows(self, table: str, method: str, count: int) -> None:
        child = self._rows.get((method, table))
        if child is None:
            child = self._rows[method, table] = self.rows_moved.labels(method, table)
        child.inc(count)

    def checkpoint_damaged(self, error: CheckpointCorrupt) -> None:
        self.checkpoint_corrupt.labels(error.table or "").inc()

    def log_damaged(self, tables: list[str]) -> None:
        for table in tables:
            self.wal_damaged.labels(table).inc()

    def checkpointed(self, info: CheckpointInfo) -> None:
        self.last_checkpoint.set(info.created_unix)
        self.checkpoint_bytes.set(info.bytes)


def serve(metrics: Metrics, port: int, host: str = "0.0.0.0") -> tuple[Any, int]:
    """Serve /metrics over HTTP in a thread; returns (server, bound port)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    return server, server.server_address[1]
