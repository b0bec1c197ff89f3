"""Before a move: can every target hold the rows of the slots it will own?

A target grows its table while it serves (the node does so when a batch
begins, ``recstore.ps.capacity``), but a table whose rows live in one device
allocation (``storage: gpu`` and ``gpu_cache``) keeps the size it started with.
A move that would overfill such a target is refused here, naming the rows
it would need, before any slot moves: otherwise it would stop halfway, at
the first batch that does not fit.
"""

from __future__ import annotations

from collections.abc import Sequence

from recstore.core.control import ControlClient, stats_rpc
from recstore.core.errors import CapacityExhausted
from recstore.core.reshard.plan import Phase, ReshardJob
from recstore.core.routing import SlotMap
from recstore.core.shard_rows import rows_for_slots
from recstore.core.spec import StorageTier, TableSpec

#: tiers whose shards grow online (the host arenas); the others keep their start-up size
GROWING_TIERS = frozenset({StorageTier.host})


def grows_online(spec: TableSpec) -> bool:
    return StorageTier(spec.storage) in GROWING_TIERS


def peak_slots(current: SlotMap, job: ReshardJob, shard: int) -> int:
    """Slots ``shard`` owns at most during the rest of ``job``: those it owns now and
    those its remaining batches bring (a source keeps its rows until a batch's cleanup)."""
    owners = current.owner_table()
    peak = owners == shard
    for batch in job.batches[job.current :]:
        owners[batch.mask()] = batch.target
    return int((peak | (owners == shard)).sum())


def check_targets(
    table: str, clients: Sequence[ControlClient], job: ReshardJob, current: SlotMap
) -> None:
    """CapacityExhausted when a target of ``job``'s remaining batches cannot grow to the
    rows it will own (asked of the nodes: their spec and capacity)."""
    if job.phase == Phase.done:
        return
    targets = sorted({b.target for b in job.batches[job.current :]})
    for shard in targets:
        stats = clients[shard].call(stats_rpc(table))
        if stats.spec is None or grows_online(stats.spec):
            continue
        slots = peak_slots(current, job, shard)
        needed = rows_for_slots(stats.spec, slots)
        if needed > stats.capacity:
            raise CapacityExhausted(
                f"table {table!r} (storage: {StorageTier(stats.spec.storage).value}) cannot "
                f"move to {job.to_shards} shards: shard {shard} would own {slots} slots, "
                f"needing {needed} rows, but holds {stats.capacity} and cannot grow while "
                "serving; nothing was moved"
            )
