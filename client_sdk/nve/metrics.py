"""Prometheus export of the NVE layers' cache counters, per tier.

A training job has no HTTP endpoint of the SDK's own; a job that serves a
``prometheus_client`` registry (an extra dependency, not a trainer's) can add
this collector to it. It reads ``cache_stats()`` of every live layer with a
cache at scrape time, labelled by table, layer and tier (host, and gpu for a
layer with a GPU cache, or a ``LinearUVM`` layer's: the engine's cache, which
counts hits, misses and evictions but not insertions, rejections or
invalidations, so those series are absent for it rather than zero).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

#: live layers with a cache (weak: a dropped layer leaves the export)
_layers: weakref.WeakSet[Any] = weakref.WeakSet()

COUNTERS = ("hits", "misses", "evictions", "insertions", "rejected", "invalidations")
GAUGES = ("hit_rate", "bytes_used", "capacity_bytes")


def track(layer: Any) -> None:
    _layers.add(layer)


class CacheCollector:
    """``prometheus_client`` collector: ``recstore_nve_cache_<counter>_total`` and gauges."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["table", "layer", "tier"]
        families: dict[str, Any] = {
            **{
                name: CounterMetricFamily(
                    f"recstore_nve_cache_{name}", f"NVE cache tier {name}", labels=labels
                )
                for name in COUNTERS
            },
            **{
                name: GaugeMetricFamily(
                    f"recstore_nve_cache_{name}", f"NVE cache tier {name}", labels=labels
                )
                for name in GAUGES
            },
        }
        for layer in list(_layers):
            host = layer.cache_stats()
            for stats in (host, host["gpu"]) if host["gpu"] else (host,):
                tier = [str(stats["table"]), str(stats["layer"]), str(stats["tier"])]
                for name, family in families.items():
                    if name in stats:
                        family.add_metric(tier, float(stats[name]))
        yield from families.values()


def register_cache_metrics(registry: Any = None) -> CacheCollector:
    """Add the collector to ``registry`` (default: prometheus_client's global one)."""
    try:
        import prometheus_client
    except ImportError as error:
        raise ImportError(
            "register_cache_metrics needs prometheus-client (pip install prometheus-client)"
        ) from error
    collector = CacheCollector()
    (registry if registry is not None else prometheus_client.REGISTRY).register(collector)
    return collector
