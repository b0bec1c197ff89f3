"""The options of one PS node, checked once when the node is configured.

``recstore ps-node`` (``recstore.ps.serve.process``) and ``start_in_thread``
(``recstore.ps.serve.server``) build the same ``NodeConfig``; a combination that
cannot work (an unknown durability, a read-only token without an auth token, a
batch bound gRPC cannot carry) is refused here, before anything touches the
data dir.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from recstore.core import TableSpec
from recstore.core.limits import DEFAULT_MAX_BATCH_BYTES, message_limit
from recstore.core.tls import ServerTls
from recstore.ps.wal.segment_file import SegmentFile, SegmentOpener


@dataclass
class NodeConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    shard_index: int = 0
    num_shards: int = 1
    device: str = "cpu"
    auth_token: str | None = None
    #: a second token whose holders may only read (recstore.ps.serve.auth.READ_ONLY_METHODS)
    read_only_token: str | None = None
    durability: str = "checkpoint"  # or "wal"
    checkpoint_interval: float = 0.0  # seconds; 0: no periodic checkpoints
    keep_checkpoints: int = 3
    metrics_port: int | None = None
    drain_seconds: float = 30.0
    #: stop (with a final checkpoint) when this process exits: the local platform's nodes
    parent_pid: int | None = None
    #: tables to host, created at start after recovery (``--table-spec-file``)
    table_specs: list[TableSpec] = field(default_factory=list)
    #: payload bytes of one request or reply, at most (``--max-batch-bytes``;
    #: recstore.ps.serve.limits)
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    #: seconds between attempts to resume writes after the write-ahead log failed
    wal_probe_interval: float = 5.0
    #: how log segments are opened (tests pass files that fail like a broken disk)
    wal_files: SegmentOpener = SegmentFile
    #: serve gRPC over TLS (mutual TLS when it names a client CA); None: plaintext
    tls: ServerTls | None = None

    def __post_init__(self) -> None:
        if self.durability not in ("checkpoint", "wal"):
            raise ValueError(f"durability must be checkpoint or wal, got {self.durability!r}")
        if self.keep_checkpoints < 1:
            raise ValueError("keep_checkpoints must be at least 1")
        message_limit(self.max_batch_bytes)  # refuses a bound gRPC cannot carry
        if not self.wal_probe_interval > 0:
            raise ValueError("wal_probe_interval must be positive")
        if self.read_only_token is not None and not self.auth_token:
            # without an auth token every caller may write: a read-only one would mean nothing
            raise ValueError("a read-only token needs an auth token")
        if self.read_only_token is not None and self.read_only_token == self.auth_token:
            raise ValueError("the read-only token must differ from the auth token")
