"""Cache figures as every view of a table shows them: one shape, one hit rate, one conversion.

Two kinds of cache sit in front of a table's rows: the engine's GPU cache of a
``gpu_cache`` table (inside a node; its counters are ``Table.stats()`` keys
``cache_*``) and the SDK's caches in trainer processes (``recstore.nve``
layers: a host tier and, on a GPU, a GPU tier in front of it), which report
their running totals to the table's nodes (``CacheReport``), one entry per
tier. The node's ``TableStats``, its Prometheus metrics, the admin API and the
dashboard all read them as ``CacheFigures``; the conversions to and from the
wire and the engine's keys, and the tiers a report may name, live here only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from recstore.v1 import ps_pb2

#: the engine's stats key of each figure (csrc/stats_dict.h)
ENGINE_KEYS = {
    "hits": "cache_hits",
    "misses": "cache_misses",
    "evictions": "cache_evictions",
    "resident_rows": "cache_resident_rows",
    "resident_bytes": "cache_resident_bytes",
    "capacity_bytes": "cache_bytes",
}


#: a layer's cache tiers, in lookup order: GPU memory first, then host memory
GPU_TIER, HOST_TIER = "gpu", "host"
TIERS = (GPU_TIER, HOST_TIER)


@dataclass(frozen=True)
class CacheFigures:
    """What one cache (or several, summed) has counted and holds."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    resident_rows: int = 0
    resident_bytes: int = 0
    capacity_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of looked-up keys the cache held (0 before any lookup)."""
        looked = self.hits + self.misses
        return self.hits / looked if looked else 0.0

    def as_dict(self) -> dict[str, float]:
        """The figures and the hit rate, as the JSON views carry them."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "hit_rate": self.hit_rate}


def total(figures: Iterable[CacheFigures]) -> CacheFigures:
    """The sum of several caches' figures (the hit rate follows from the sums)."""
    sums = dict.fromkeys((f.name for f in fields(CacheFigures)), 0)
    for one in figures:
        for name in sums:
            sums[name] += getattr(one, name)
    return CacheFigures(**sums)


def engine_figures(engine: Mapping[str, float]) -> CacheFigures | None:
    """The GPU cache's figures from a table's engine stats; None for a table without one."""
    if ENGINE_KEYS["hits"] not in engine:
        return None
    return CacheFigures(**{name: int(engine.get(key, 0)) for name, key in ENGINE_KEYS.items()})


@dataclass(frozen=True)
class ClientCache:
    """One cache tier of a layer in a trainer process, as it last reported itself to a node."""

    client: str  # the reporting process (host:pid:role)
    layer: str  # the layer (or cache) name within that process
    policy: str
    figures: CacheFigures
    reported_unix: float = 0.0  # the node's clock when the report arrived
    tier: str = HOST_TIER  # one of TIERS

    @property
    def key(self) -> tuple[str, str, str]:
        """What one report replaces: the same tier of the same layer of the same client."""
        return (self.client, self.layer, self.tier)


def counters_to_proto(figures: CacheFigures) -> ps_pb2.CacheCounters:
    return ps_pb2.CacheCounters(**{f.name: getattr(figures, f.name) for f in fields(figures)})


def counters_from_proto(message: ps_pb2.CacheCounters) -> CacheFigures:
    return CacheFigures(**{f.name: getattr(message, f.name) for f in fields(CacheFigures)})


def client_cache_to_proto(cache: ClientCache) -> ps_pb2.CacheClientStats:
    return ps_pb2.CacheClientStats(
        client=cache.client,
        layer=cache.layer,
        policy=cache.policy,
        counters=counters_to_proto(cache.figures),
        reported_unix=cache.reported_unix,
        tier=cache.tier,
    )


def client_cache_from_proto(message: ps_pb2.CacheClientStats) -> ClientCache:
    return ClientCache(
        client=message.client,
        layer=message.layer,
        policy=message.policy,
        figures=counters_from_proto(message.counters),
        reported_unix=message.reported_unix,
        tier=message.tier or HOST_TIER,  # a client from before tiers reports its host cache
    )


def latest_per_cache(caches: Iterable[ClientCache]) -> list[ClientCache]:
    """One entry per (client, layer, tier): the newest report (a client reports to every
    shard), by client and layer, the GPU tier before the host tier (lookup order)."""
    newest: dict[tuple[str, str, str], ClientCache] = {}
    for cache in caches:
        key = cache.key
        if key not in newest or cache.reported_unix > newest[key].reported_unix:
            newest[key] = cache
    return [newest[key] for key in sorted(newest)]


def totals_per_tier(caches: Iterable[ClientCache]) -> dict[str, CacheFigures]:
    """The sum of each tier's caches (tiers none reported left out): a GPU tier's misses
    are its host tier's lookups, so summing across tiers would count a lookup twice."""
    by_tier: dict[str, list[CacheFigures]] = {}
    for cache in caches:
        by_tier.setdefault(cache.tier, []).append(cache.figures)
    return {tier: total(by_tier[tier]) for tier in sorted(by_tier)}
