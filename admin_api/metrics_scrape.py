"""Read a PS node's Prometheus /metrics for the dashboard's per-shard charts.

The names are the ones ``recstore.ps.serve.metrics`` publishes:

- ``recstore_ps_table_rows{table}``           gauge: rows held
- ``recstore_ps_table_memory_bytes{table}``   gauge: bytes of rows and optimizer state
- ``recstore_ps_requests_total{method,code}`` counter: RPCs served
- ``recstore_ps_request_seconds{method}``     histogram: RPC latency
- ``recstore_ps_table_cache_*{table}``        the engine's GPU cache (gpu_cache tables)
- ``recstore_ps_table_client_cache_*{table,client,layer,tier,policy}``  the caches
  clients reported to the node, per tier (``recstore.core.cache_figures``; a node
  from before tiers sends no ``tier`` label: its caches are host caches)

Requests and latency are per node, not per table; only the data-path methods
count (Pull, Push, Update and their multi-table forms), so control calls such
as the provisioner's stats polling do not inflate QPS. Both provisioners run
one node per shard of one table, so per node is per table there. Counters come
back raw; the browser turns two samples into QPS and mean latency.

The dashboard fetches these URLs on a viewer's request, so the fetch is kept
narrow: only nodes the provisioner identity registered are asked (the caller
passes None for the others), redirects are never followed, the body is read
up to MAX_BODY_BYTES within the timeout, and an error names the failure and
the status code only, never any part of what the endpoint sent.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from recstore.core.cache_figures import ENGINE_KEYS, HOST_TIER, CacheFigures, ClientCache

ROWS = "recstore_ps_table_rows"
MEMORY = "recstore_ps_table_memory_bytes"
REQUESTS = "recstore_ps_requests_total"
LATENCY_SUM = "recstore_ps_request_seconds_sum"
LATENCY_COUNT = "recstore_ps_request_seconds_count"
DATA_METHODS = frozenset({"Pull", "Push", "Update", "MultiPull", "MultiUpdate"})
#: A PS node's exposition is a few KiB; anything far larger is not one.
MAX_BODY_BYTES = 4 * 1024 * 1024
NOT_PROVISIONED = "no metrics endpoint registered by the provisioner"
#: sample name (a counter's without ``_total``) -> CacheFigures field
ENGINE_CACHE = {f"recstore_ps_table_{key}": name for name, key in ENGINE_KEYS.items()}
CLIENT_CACHE_PREFIX = "recstore_ps_table_client_cache_"
CLIENT_REPORTED = "reported_timestamp_seconds"
_FIGURES = frozenset(CacheFigures.__dataclass_fields__)


class ScrapeFailed(Exception):
    """A scrape failed; the message is safe to show (it holds nothing the endpoint sent)."""


@dataclass
class NodeSample:
    rows: float | None = None
    memory_bytes: float | None = None
    requests_total: float | None = None
    latency_sum: float | None = None
    latency_count: float | None = None
    error: str | None = None
    engine_cache: CacheFigures | None = None  # a gpu_cache table's GPU cache on this node
    client_caches: list[ClientCache] = field(default_factory=list)  # as reported to it, per tier

    def to_dict(self) -> dict[str, Any]:
        """The chart figures (the caches have their own view, ``cache_view``)."""
        return {k: v for k, v in asdict(self).items() if k not in ("engine_cache", "client_caches")}


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
    engine: dict[str, int] = {}
    clients: dict[tuple[str, str, str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("table", table) != table:
                continue
            name = s.name.removesuffix("_total")
            if name in ENGINE_CACHE:
                engine[ENGINE_CACHE[name]] = int(s.value)
            elif name.startswith(CLIENT_CACHE_PREFIX):
                key = (s.labels.get("client", ""), s.labels.get("layer", ""),
                       s.labels.get("tier", HOST_TIER), s.labels.get("policy", ""))  # fmt: skip
                clients.setdefault(key, {})[name.removeprefix(CLIENT_CACHE_PREFIX)] = s.value
            elif s.name == ROWS:
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
    if engine:
        sample.engine_cache = CacheFigures(**engine)
    sample.client_caches = [
        ClientCache(
            client,
            layer,
            policy,
            CacheFigures(**{k: int(v) for k, v in values.items() if k in _FIGURES}),
            values.get(CLIENT_REPORTED, 0.0),
            tier,
        )
        for (client, layer, tier, policy), values in sorted(clients.items())
    ]
    return sample


async def _fetch(client: httpx.AsyncClient, url: str) -> str:
    """The body of a 200 answer, at most MAX_BODY_BYTES; ScrapeFailed otherwise."""
    async with client.stream("GET", url) as response:
        if response.is_redirect:
            raise ScrapeFailed(f"HTTP {response.status_code}: redirects are not followed")
        if response.status_code != 200:
            raise ScrapeFailed(f"HTTP {response.status_code}")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ScrapeFailed(f"the answer is larger than {MAX_BODY_BYTES} bytes")
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise ScrapeFailed("the answer is not UTF-8 text") from None


async def scrape_node(client: httpx.AsyncClient, endpoint: str, table: str) -> NodeSample:
    """One node's sample; a failure is reported in ``error``, never raised."""
    try:
        text = await _fetch(client, metrics_url(endpoint))
    except ScrapeFailed as exc:
        return NodeSample(error=str(exc))
    except httpx.HTTPError as exc:  # the type says enough; the message may quote the peer
        return NodeSample(error=f"unreachable ({type(exc).__name__})")
    try:
        return parse_node_metrics(text, table)
    except ValueError:  # the parser's message quotes the offending line
        return NodeSample(error="the answer is not Prometheus text exposition")


async def scrape_nodes(
    endpoints: list[str | None], table: str, *, timeout: float
) -> list[NodeSample]:
    """Samples of all nodes, scraped concurrently, in the order given (None: not asked)."""
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:

        async def one(endpoint: str | None) -> NodeSample:
            if endpoint is None:
                return NodeSample(error=NOT_PROVISIONED)
            return await scrape_node(client, endpoint, table)

        return list(await asyncio.gather(*(one(e) for e in endpoints)))
