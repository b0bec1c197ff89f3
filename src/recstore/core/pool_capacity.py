"""What the tables of a pool reserve on each node, and which of them fit.

A pool's nodes hold a share of every table placed on it, so a table fits only
if the sum of the tables' shares stays within what the pool asks for a node
(its memory request, less the node process's own share; its GPUs' memory where
it declares it). The figures are the engine's own reservation at creation
(``csrc/table.cc``, ``Table::stats``): the row arena with its optimizer state,
the hash index of a sharded or hashed table, and the per-row bookkeeping;
a ``gpu_cache`` table adds its cache on the GPU. Pure functions of the specs, so
the operator's refusal, the pool's status and a test table agree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from recstore.core.pool import PoolSpec
from recstore.core.shard_rows import cache_size, shard_layout
from recstore.core.spec import GPU_CACHE_SLOT_BYTES, Eviction, StorageTier, TableSpec

#: a node process before any table: interpreter, gRPC, native module (measured RSS)
NODE_BYTES = 150 * 2**20
#: one slot of the engine's hash index (csrc/hash_index.h, packed key + row)
INDEX_SLOT_BYTES = 12
#: per row of a table that evicts or expires rows: its key, tick and touch count
ROW_TRACKING_BYTES = 8 + 4 + 8
_SUFFIXES = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity in bytes ("4Gi", "500M", "1.5Gi"), rounded down."""
    match = _QUANTITY.fullmatch(quantity)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    number, suffix = match.groups()
    if suffix == "m":  # milli-bytes: a fraction of a byte each
        return int(float(number) / 1000)
    whole, _, fraction = number.partition(".")
    scale = _SUFFIXES[suffix or ""]
    return int(whole) * scale + (int(fraction) * scale // 10 ** len(fraction) if fraction else 0)


@dataclass(frozen=True)
class Footprint:
    """Bytes one node reserves for a table (or several, summed)."""

    host: int = 0
    gpu: int = 0

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.host + other.host, self.gpu + other.gpu)


def engine_bytes(spec: TableSpec, shards: int) -> int:
    """The engine's reservation for the largest shard of ``spec`` over ``shards`` nodes."""
    layout = shard_layout(spec, 0, shards)
    rows = layout.capacity
    arena = rows * (spec.row_bytes + spec.state_width * 4)
    index = 0 if layout.direct else (rows + rows // 4 + 8) * INDEX_SLOT_BYTES
    bookkeeping = rows if layout.direct else 0
    if not layout.direct and (
        Eviction(spec.keys.eviction) != Eviction.none or spec.keys.ttl_seconds is not None
    ):
        bookkeeping += rows * ROW_TRACKING_BYTES
    return arena + index + bookkeeping


def footprint(spec: TableSpec, shards: int) -> Footprint:
    """What one node of a ``shards``-node pool reserves for ``spec``, host and GPU."""
    tier, table = StorageTier(spec.storage), engine_bytes(spec, shards)
    if tier == StorageTier.gpu:
        return Footprint(gpu=table)
    if tier == StorageTier.gpu_cache:  # every row in host memory, a cache of some on the GPU
        rows, size = cache_size(spec, 0, shards)
        return Footprint(host=table, gpu=size or rows * (spec.row_bytes + GPU_CACHE_SLOT_BYTES))
    return Footprint(host=table)


@dataclass(frozen=True)
class Budget:
    """What a node of the pool may give its tables."""

    request: int  # the pool's memory request per node
    host: int  # the request less the node process's own share
    gpu: int | None  # gpus x gpuMemory, when the pool declares its GPUs' memory


def budget(pool: PoolSpec) -> Budget:
    request = quantity_bytes(pool.placement.resources.memory)
    gpu = None
    if pool.gpu_memory is not None:
        gpu = pool.placement.gpus * quantity_bytes(pool.gpu_memory)
    return Budget(request=request, host=max(0, request - NODE_BYTES), gpu=gpu)


@dataclass(frozen=True)
class Admission:
    """Which tables fit, in the order given, and why the others do not."""

    placed: dict[str, Footprint] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    reserved: Footprint = Footprint()


def admit(
    pool_name: str, pool: PoolSpec, tables: Sequence[tuple[str, TableSpec]], shards: int
) -> Admission:
    """Place ``tables`` in order on ``shards`` nodes of the pool: each one that fits beside
    those placed before it is placed; one that does not is refused with the figures."""
    limits, admission = budget(pool), Admission()
    reserved = Footprint()
    for name, spec in tables:
        need = footprint(spec, shards)
        total = reserved + need
        problem = None
        if total.host > limits.host:
            problem = _over("memory", name, pool_name, need.host, reserved.host, limits.host)
            problem += f" ({_mib(limits.request)} requested less {_mib(NODE_BYTES)} for the node)"
        elif limits.gpu is not None and total.gpu > limits.gpu:
            problem = _over("GPU memory", name, pool_name, need.gpu, reserved.gpu, limits.gpu)
            problem += f" ({pool.placement.gpus} x gpuMemory {pool.gpu_memory})"
        if problem is None:
            admission.placed[name] = need
            reserved = total
        else:
            admission.refused[name] = problem + f" on each of {shards} nodes"
    return Admission(admission.placed, admission.refused, reserved)


def _over(what: str, table: str, pool: str, need: int, held: int, limit: int) -> str:
    return (
        f"table {table!r} needs {_mib(need)} of {what} per node of pool {pool!r}, which its "
        f"other tables reserve {_mib(held)} of, out of {_mib(limit)}"
    )


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
