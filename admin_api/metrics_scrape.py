"""Read a PS node's Prometheus /metrics for the dashboard's per-shard charts.

The names are the ones ``recstore.ps.metrics`` publishes:

- ``recstore_ps_table_rows{table}``           gauge: rows held
- ``recstore_ps_table_memory_bytes{table}``   gauge: bytes of rows and optimizer state
- ``recstore_ps_requests_total{method,code}`` counter: RPCs served
- ``recstore_ps_request_seconds{method}``     histogram: RPC latency

Requests and latency are per node, not per table; only the data-path methods
count (Pull, Push, Update and their multi-table forms), so control calls such
as the provisioner's stats polling do not inflate QPS. Both provisioners run
one node per shard of one table, so per node is per table there. Counters come
back raw; the browser turns two samples into QPS and mean latency.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROWS = "recstore_ps_table_rows"
MEMORY = "recstore_ps_table_memory_bytes"
REQUESTS = "recstore_ps_requests_total"
LATENCY_SUM = "recstore_ps_request_seconds_sum"
LATENCY_COUNT = "recstore_ps_request_seconds_count"
DATA_METHODS = frozenset({"Pull", "Push", "Update", "MultiPull", "MultiUpdate"})


@dataclass
class NodeSample:
    rows: float | None = None
    memory_bytes: float | None = None
    requests_total: float | None = None
    latency_sum: float | None = None
    latency_count: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def metrics_url(endpoint: str) -> str:
    """``host:port`` -> ``http://host:port/metrics``; full URLs are kept."""
    if endpoint.startswith(("http://", "https://")):
        return endpoint
    return f"http://{endpoint}/metrics"


def _add(current: float | None, value: float) -> float:
    return value if current is None else current + value


def parse_node_metrics(text: str, table: str) -> NodeSample:
    """Sum the samples of ``table`` (samples without a table label count for every table)."""
    sample = NodeSample()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("table", table) != table:
                continue
            if s.name == ROWS:
                sample.rows = _add(sample.rows, s.value)
            elif s.name == MEMORY:
                sample.memory_bytes = _add(sample.memory_bytes, s.value)
            elif s.labels.get("method") not in DATA_METHODS:
                continue
            elif s.name == REQUESTS:
                sample.requests_total = _add(sample.requests_total, s.value)
            elif s.name == LATENCY_SUM:
                sample.latency_sum = _add(sample.latency_sum, s.value)
            elif s.name == LATENCY_COUNT:
                sample.latency_count = _add(sample.latency_count, s.value)
    return sample


async def scrape_node(client: httpx.AsyncClient, endpoint: str, table: str) -> NodeSample:
    """One node's sample; a failure is reported in ``error``, never raised."""
    try:
        response = await client.get(metrics_url(endpoint))
        response.raise_for_status()
        return parse_node_metrics(response.text, table)
    except (httpx.HTTPError, ValueError) as exc:
        return NodeSample(error=f"{type(exc).__name__}: {exc}"[:300])


async def scrape_nodes(
    endpoints: list[str | None], table: str, *, timeout: float
) -> list[NodeSample]:
    """Samples of all nodes, scraped concurrently, in the order given."""
    async with httpx.AsyncClient(timeout=timeout) as client:

        async def one(endpoint: str | None) -> NodeSample:
            if endpoint is None:
                return NodeSample(error="no metrics endpoint registered")
            return await scrape_node(client, endpoint, table)

        return list(await asyncio.gather(*(one(e) for e in endpoints)))
