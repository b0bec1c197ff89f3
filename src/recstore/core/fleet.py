"""A fleet of PS nodes: how many run, where, and with which node-wide arguments.

A table with no pool has a fleet of its own (its shards, its placement, its
checkpoint policy); an ``EmbeddingPool`` is a fleet that many tables share. The
operator renders the same StatefulSet for either and the local provisioner
starts the same ``recstore ps-node`` processes, so what a node process is
started with is decided here once, from a ``Fleet``, whichever declared it.
"""

from __future__ import annotations

from dataclasses import dataclass

from recstore.core.placement import Placement
from recstore.core.spec import Checkpoint, Durability, StorageTier, TableSpec
from recstore.core.tls import ServerTls

GRPC_PORT = 50051
#: a PS pod listens on all its addresses (loopback is the node's own default)
POD_LISTEN_HOST = "0.0.0.0"
METRICS_PORT = 9100
DATA_DIR = "/data"


@dataclass(frozen=True)
class Fleet:
    """The node processes of one table's own fleet or of a pool."""

    shards: int
    placement: Placement
    #: durability and periodic checkpoints are node-wide: every table of a node has them
    checkpoint: Checkpoint
    #: the nodes keep rows on their GPU (``--device cuda``), else in host memory
    gpu: bool
    #: the nodes accept read-only tokens besides the write token
    read_only_tokens: bool = False
    #: the one table a table's own fleet serves (the pods' ``RECSTORE_TABLE``); None: a pool
    table: str | None = None


def table_fleet(spec: TableSpec, placement: Placement) -> Fleet:
    """The fleet of a table with no pool: its own shards, placement and checkpoints."""
    return Fleet(
        shards=spec.shards,
        placement=placement,
        checkpoint=spec.checkpoint,
        gpu=StorageTier(spec.storage) != StorageTier.host,
        # an inference table's readers never write; a training table's trainers all do
        read_only_tokens=spec.inference,
        table=spec.name,
    )


def node_args(
    fleet: Fleet,
    *,
    shard_index: int | str,
    port: int = GRPC_PORT,
    metrics_port: int = METRICS_PORT,
    data_dir: str = DATA_DIR,
    auth_token_file: str | None = None,
    read_only_token_file: str | None = None,
    host: str = POD_LISTEN_HOST,
    tls: ServerTls | None = None,
) -> list[str]:
    """Arguments of ``recstore ps-node`` for one node of ``fleet``.

    ``read_only_token_file`` is passed to the nodes of a fleet that takes read-only
    tokens (``Fleet.read_only_tokens``); it needs ``auth_token_file``.

    ``host`` is the address the node listens on: every address of a pod by
    default (its Service reaches it there); the node itself defaults to loopback.

    ``shard_index`` may be a string such as ``$(RECSTORE_SHARD_INDEX)`` where
    the runtime substitutes it (Kubernetes expands ``$(VAR)`` in args).
    """
    args = [
        "ps-node",
        "--port", str(port),
        "--metrics-port", str(metrics_port),
        "--data-dir", data_dir,
        "--shard-index", str(shard_index),
        "--num-shards", str(fleet.shards),
        "--device", "cuda" if fleet.gpu else "cpu",
        "--durability", Durability(fleet.checkpoint.durability).value,
        "--checkpoint-interval", str(fleet.checkpoint.interval_seconds),
        "--keep-checkpoints", str(fleet.checkpoint.keep),
        "--host", host,
    ]  # fmt: skip
    if read_only_token_file and not auth_token_file:
        raise ValueError("a read-only token file needs an auth token file (else anyone writes)")
    if auth_token_file:
        args += ["--auth-token-file", auth_token_file]
    if read_only_token_file and fleet.read_only_tokens:
        args += ["--read-only-token-file", read_only_token_file]
    if tls is not None:
        args += tls.args()
    return args
