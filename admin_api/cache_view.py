"""A table's caches as the admin API and the dashboard show them, read from its nodes live.

Two kinds: the engine's GPU cache of a ``gpu_cache`` table, one per shard
(summed for the table), and the caches of trainer processes' layers (a host
tier and, on a GPU, a GPU tier), which report to every node of the table
(``CacheReport``), so each (client, layer, tier) is shown once, from its
newest report, and the clients' caches are summed per tier. Both come from the nodes' /metrics
(``metrics_scrape``), fetched when a viewer asks, like the dashboard's charts;
nothing is stored in the catalogue.
"""

from __future__ import annotations

from typing import Any

from fastapi.concurrency import run_in_threadpool

from recstore.admin import crud
from recstore.admin.context import AppContext
from recstore.admin.metrics_scrape import NodeSample, scrape_nodes
from recstore.core.cache_figures import latest_per_cache, total, totals_per_tier


async def scrape_table(
    context: AppContext, name: str
) -> tuple[list[dict[str, Any]], list[NodeSample]]:
    """Every registered node of ``name`` (index, endpoint, heartbeat sizes) and its sample."""

    def load() -> list[dict[str, Any]]:
        with context.sessions() as session:
            table = crud.get_table(session, name=name)
            return [
                {
                    "index": n.shard_index,
                    "endpoint": n.endpoint,
                    "ready": n.ready,
                    "rows": n.rows,
                    "memory_bytes": n.memory_bytes,
                    # Only the provisioner's nodes are fetched (the fetch runs for a viewer).
                    "metrics_endpoint": n.metrics_endpoint if n.provisioned else None,
                }
                for n in table.nodes
            ]

    shards = await run_in_threadpool(load)
    samples = await scrape_nodes(
        [s.pop("metrics_endpoint") for s in shards],
        name,
        timeout=context.settings.metrics_scrape_timeout,
    )
    return shards, samples


def cache_view(shards: list[dict[str, Any]], samples: list[NodeSample]) -> dict[str, Any]:
    """Per shard and in total: hits, misses, evictions, hit rate, resident rows and bytes."""
    engines = [s.engine_cache for s in samples if s.engine_cache is not None]
    clients = latest_per_cache(c for s in samples for c in s.client_caches)
    return {
        "shards": [
            {
                "index": shard["index"],
                "engine": None if sample.engine_cache is None else sample.engine_cache.as_dict(),
                "error": sample.error,
            }
            for shard, sample in zip(shards, samples, strict=True)
        ],
        "engine_total": total(engines).as_dict() if engines else None,
        "clients": [
            {
                "client": c.client,
                "layer": c.layer,
                "tier": c.tier,
                "policy": c.policy,
                "reported_unix": c.reported_unix,
                **c.figures.as_dict(),
            }
            for c in clients
        ],
        "clients_total": {
            tier: figures.as_dict() for tier, figures in totals_per_tier(clients).items()
        },
    }
