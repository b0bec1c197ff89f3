"""A Hierarchical layer's lookups through its GPU cache, then its host cache and the table.

``DeviceCachedTable`` puts a ``DeviceRowCache`` in front of a ``CachedTable``
(the host cache, possibly of 0 bytes, and the table's versions): a lookup
de-dups its keys on the device, gathers the hits there and sends only the
misses down; their rows come back, go to every position that asked for them
and are offered to the device tier. The freshness rules are the host cache's:

- exact (inference, or training without ``max_staleness_steps``): every lookup
  goes down, even when every key hit on the device (an empty miss list), so
  that ``CachedTable`` compares the table's versions as it does for its own
  hits. When it finds them moved it drops the host cache; the device tier's
  rows are then no more current, so it drops them too and reads the whole
  lookup down again (rows not known current on every node are served, not
  kept). The guarantee and the ``version_check_interval`` bound are
  ``recstore.client.nve.freshness``'s, for both tiers.
- bounded staleness (training with ``max_staleness_steps=k``): a device row
  serves while the step it was read at from the table is at most k steps
  back. A row the host cache served may already be up to k steps old, so the
  device tier records the oldest step it may be from (``CachedTable``'s
  ``oldest_reads``), never the current one: the bound is k across both tiers.
  Updates still go to the table's optimizer, never into a cache.
"""

from __future__ import annotations

import torch

from recstore.client.nve.cached import CachedTable, CacheReport, cache_report
from recstore.client.nve.device_cache import DeviceRowCache
from recstore.core.cache_figures import GPU_TIER


class DeviceCachedTable:
    """Rows of ``lower``'s table through ``tier`` (on the layer's device), then ``lower``."""

    def __init__(self, lower: CachedTable, tier: DeviceRowCache) -> None:
        self.lower, self.tier = lower, tier

    def _invalidations(self) -> int:
        return self.lower.cache.stats.invalidations

    def read(self, keys: torch.Tensor) -> torch.Tensor:
        """One row per element of ``keys`` (int64, any repeats), on the tier's device."""
        lower, tier = self.lower, self.tier
        staleness = lower.max_staleness_steps
        since = None if staleness is None else lower.step - staleness
        unique, inverse = torch.unique(keys.to(tier.device), return_inverse=True)
        hit, slots = tier.lookup(unique, read_since=since)
        out = torch.empty((unique.numel(), tier.dim), dtype=tier.dtype, device=tier.device)
        out[hit] = tier.rows(slots)
        miss = ~hit
        missed = unique[miss]
        if staleness is not None and not missed.numel():
            return out[inverse]
        before = self._invalidations()
        fetched = lower.read(missed.cpu()).to(tier.device)
        if staleness is None and self._invalidations() != before:
            return self._read_again(unique, inverse, int(slots.numel()))
        out[miss] = fetched
        if staleness is None:
            born: int | torch.Tensor = lower.step
        else:
            assert lower.oldest_reads is not None
            born = torch.from_numpy(lower.oldest_reads).to(tier.device)
        self._offer(missed, fetched, born)
        return out[inverse]

    def _read_again(self, unique: torch.Tensor, inverse: torch.Tensor, hits: int) -> torch.Tensor:
        """The table moved on: no device row is current, nor were this lookup's hits."""
        tier = self.tier
        tier.clear()
        tier.recount_hits(hits)
        before = self._invalidations()
        rows = self.lower.read(unique.cpu()).to(tier.device)
        if self._invalidations() == before:  # current on every node: kept
            self._offer(unique, rows, self.lower.step)
        return rows[inverse]

    def _offer(self, keys: torch.Tensor, rows: torch.Tensor, born: int | torch.Tensor) -> None:
        chunk = self.lower.max_modify_size or max(1, keys.numel())
        for start in range(0, keys.numel(), chunk):
            end = start + chunk
            step = born[start:end] if isinstance(born, torch.Tensor) else born
            self.tier.insert(keys[start:end], rows[start:end], step)

    def report(self) -> CacheReport:
        """The device tier's counters, as ``CachedTable.report`` gives the host tier's."""
        return cache_report(self.lower.name, self.lower.layer, GPU_TIER, self.tier)
