"""One pool as the local provisioner holds it, and which of its tables its nodes hold.

A pool is ``shards`` node processes that every table naming it (``spec.pool``) is created
on, each table with its own slot map over the pool's nodes. Its state directory,
``state_dir/pools/<name>/``, holds the nodes' ports (``ports.json``, stable across
restarts of `recstore up`), one data directory and one log per node. Which tables the
nodes hold is decided in one order (those placed already, then in the order they were
declared) by the shared capacity rule (``recstore.core.pool_capacity.admit``), as the
operator decides it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from recstore.core.pool import PoolSpec, PoolStatus, checkpoint_problem, table_problem_on
from recstore.core.pool_capacity import Admission, admit
from recstore.core.pool_reshard import PoolMoveState
from recstore.core.reconcile import PoolPlacing
from recstore.core.spec import StorageTier, TableSpec
from recstore.local.shard_client import ShardClient
from recstore.local.table import LocalTable


@dataclass
class LocalPool:
    name: str
    spec: PoolSpec
    directory: Path
    ports: list[tuple[int, int]]  # (grpc, metrics) per node
    clients: list[ShardClient]
    generation: int = 1
    #: the status last reported (None until the first report)
    status: PoolStatus | None = None
    #: how the last change of its shards goes (None: none since the provisioner started)
    moves: PoolMoveState | None = None
    #: the thread moving its nodes and tables to ``spec.shards`` (``recstore.local.pool_moves``)
    mover: threading.Thread | None = None
    #: set by a table's move at each step, so the pool's move takes its next one
    changed: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def shards(self) -> int:
        """The nodes running (``spec.shards`` once a change of it has moved every table)."""
        return len(self.ports)

    def save_ports(self) -> None:
        (self.directory / "ports.json").write_text(json.dumps(self.ports))

    def endpoint(self, shard: int) -> str:
        return f"127.0.0.1:{self.ports[shard][0]}"

    def shard_dir(self, shard: int) -> Path:
        return self.directory / f"shard-{shard}"

    def process_name(self, shard: int) -> str:
        return pool_process_name(self.name, shard)

    def held_spec(self, spec: TableSpec) -> TableSpec:
        """The table as the pool's nodes hold it: their shard count and checkpoints."""
        return spec.model_copy(update={"shards": self.shards, "checkpoint": self.spec.checkpoint})

    def refusal(self, table: TableSpec) -> str | None:
        """Why the pool's nodes can never hold ``table`` (a GPU tier without GPUs, checkpoints
        of its own); None when only its size decides."""
        return table_problem_on(
            self.name, self.spec, StorageTier(table.storage)
        ) or checkpoint_problem(self.name, self.spec, table.checkpoint)

    def admission(self, tables: Sequence[LocalTable]) -> Admission:
        """Which of ``tables`` (all naming this pool) its nodes hold: those placed already
        first, then the others in the order given, each while it fits."""
        ordered = [t for t in tables if t.ports] + [t for t in tables if not t.ports]
        return admit(
            self.name,
            self.spec,
            [(t.spec.name, self.held_spec(t.spec)) for t in ordered if t.unfit is None],
            self.shards,
        )


def pool_process_name(pool: str, shard: int) -> str:
    """The supervisor's name of a pool node's process (no table name holds ':')."""
    return f"pool:{pool}/shard-{shard}"


def waiting_for(pool: str) -> PoolPlacing:
    return PoolPlacing(pool, waiting=f"pool {pool!r} does not exist; the table waits for it")
