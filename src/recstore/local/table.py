"""One table as the local provisioner holds it: its shards' ports, clients and state dir.

The provisioner's parts (table provisioning, the status reports, the online
move) all read and change the same per-table facts; they live here with the
layout of the table's state directory, ``state_dir/tables/<name>/``: the
shard ports (``ports.json``, stable across restarts of `recstore up`), one
data directory and one log per shard, and the slot map and move job
(``migration.json``, ``recstore.local.reshard_store``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from recstore.core.checkpoint_status import TableCheckpoint
from recstore.core.reconcile import PoolPlacing, Resharding
from recstore.core.reshard.plan import Phase
from recstore.core.reshard.retry import RetryPolicy
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec
from recstore.core.status import TableStatus
from recstore.local.ports import claim, free_port
from recstore.local.reshard_store import FileJobStore
from recstore.local.shard_client import ShardClient

#: when a node that refused a table is asked again: 1 s, doubling to a minute
REFUSAL_RETRY = RetryPolicy(first_s=1.0, cap_s=60.0)


@dataclass
class RetryBackoff:
    """When to ask a node again after a refusal, by ``policy``'s waits; a success resets it."""

    policy: RetryPolicy = REFUSAL_RETRY
    failures: int = 0
    next_at: float = 0.0

    @property
    def delay(self) -> float:
        """The wait the next refusal starts."""
        wait = self.policy.delay(self.failures + 1)
        assert wait is not None, "a refusal back-off never gives up"
        return wait

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def failed(self, now: float) -> None:
        self.next_at = now + self.delay
        self.failures += 1

    def succeeded(self) -> None:
        self.failures, self.next_at = 0, 0.0


@dataclass
class LocalTable:
    spec: TableSpec
    directory: Path
    ports: list[tuple[int, int]]  # (grpc, metrics) per shard
    clients: list[ShardClient]
    node_ids: list[int | None]
    #: the status last reported (None until the first report)
    status: TableStatus | None = None
    generation: int = 1
    #: the newest checkpoint every shard wrote, since the provisioner started
    last_checkpoint: TableCheckpoint | None = None
    #: the newest checkpoint asked for on demand, however it went (Running while it runs)
    checkpoint_request: TableCheckpoint | None = None
    refused: str | None = None  # why a node does not host the table (shown in the status)
    refused_reason: str | None = None  # the node's own words, to say a refusal once
    retry: RetryBackoff = field(default_factory=RetryBackoff)
    #: one CreateTable attempt at a time (the poller and ``report_now`` both ask)
    ensuring: threading.Lock = field(default_factory=threading.Lock)
    #: one status report at a time (the poller and a move's commits both report)
    reporting: threading.Lock = field(default_factory=threading.Lock)
    #: the slot map and reshard job, once the table was (or is being) resharded online
    store: FileJobStore | None = None
    moving: Resharding | None = None
    resharder: threading.Thread | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    #: the pool whose nodes hold the table (None: nodes of its own); ``ports`` and
    #: ``clients`` are then the pool's nodes', empty until it is placed there
    pool: str | None = None
    #: a table on a pool: placed, waiting for the pool, or too large for it
    placing: PoolPlacing | None = None
    #: why the pool can never hold it (a GPU tier without GPUs, checkpoints of its own)
    unfit: str | None = None

    @property
    def held(self) -> bool:
        """On a pool and not placed there: no node holds it."""
        return self.pool is not None and not self.ports

    def create_map(self) -> SlotMap | None:
        """The slot map a node is given the table with: the committed one of a table moved
        online, the initial one over a pool's nodes (a pool's node holds tables of any
        count), else the node's own (None)."""
        if self.store is not None:
            return self.store.slot_map()
        return SlotMap.initial(len(self.ports)) if self.pool is not None else None

    def endpoint(self, shard: int) -> str:
        return f"127.0.0.1:{self.ports[shard][0]}"

    def shard_dir(self, shard: int) -> Path:
        return self.directory / f"shard-{shard}"

    def process_name(self, shard: int) -> str:
        return process_name(self.spec.name, shard)

    def save_ports(self) -> None:
        (self.directory / "ports.json").write_text(json.dumps(self.ports))

    def sizing_shards(self, shard: int) -> int:
        """The shard count a node is started with: it sizes its engine tables for that share
        (a target then grows them to what a move gives it, ``recstore.ps.capacity``).

        While a move runs, a shard kept by both counts is sized for the smaller one, as
        it may hold that share of the rows; the others for all the shards running.
        """
        job = self.store.job() if self.store is not None else None
        if job is not None and job.phase != Phase.done:
            kept = min(job.from_shards, job.to_shards)
            if shard < kept:
                return kept
        return len(self.ports)


def process_name(table: str, shard: int) -> str:
    """The supervisor's name of a shard's node process."""
    return f"{table}/shard-{shard}"


def load_or_pick_ports(path: Path, shards: int) -> list[tuple[int, int]]:
    """Ports a table's shards listened on before (as many as ran), else fresh free ports."""
    if path.exists():
        saved = [tuple(p) for p in json.loads(path.read_text())]
        if saved:
            pairs = [(int(g), int(m)) for g, m in saved]
            claim([port for pair in pairs for port in pair])
            return pairs
    ports = [(free_port(), free_port()) for _ in range(shards)]
    path.write_text(json.dumps(ports))
    return ports
