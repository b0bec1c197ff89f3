"""Save and load of a node's tables (checkpoints + write-ahead logs).

A save holds each table's lock while its rows stream to disk and, in WAL mode,
rotates that table's log at the same instant, so a checkpoint plus the log
segments from its recorded generation reproduce the table exactly. A written
checkpoint is read back from the device and verified before anything relies
on it; the log is then trimmed only below the generation of the oldest
checkpoint kept, so each kept checkpoint can still be brought forward to the
present if a newer one turns out damaged (see ``recstore.ps.checkpoint.recovery``). A
table whose policy says so is saved as an increment over the previous
checkpoint (``recstore.ps.checkpoint.incremental``); restoring it replays its chain.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from recstore.core import slots_touched
from recstore.core.errors import CheckpointCorrupt, TableNotFound
from recstore.ps.catalogue import CatalogueEntry
from recstore.ps.checkpoint import incremental
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.checkpoint import write as checkpoint
from recstore.ps.checkpoint.write import CheckpointInfo
from recstore.ps.hosted_table import HostedTable
from recstore.ps.node import Node
from recstore.ps.wal.records import OP_ERASE, OP_IMPORT, OP_PUSH, OP_STEP, WalRecord

log = logging.getLogger(__name__)

#: hears of every damaged checkpoint met (the node counts them in its metrics)
OnDamaged = Callable[[CheckpointCorrupt], None]


def checkpoint_root(node: Node) -> Path:
    return node.data_dir / "checkpoints"


def reporter(on_damaged: OnDamaged | None) -> OnDamaged:
    """Log a damaged checkpoint loudly, then pass it on."""

    def report(error: CheckpointCorrupt) -> None:
        log.error(
            "checkpoint damaged: %s", error,
            extra={"checkpoint": error.checkpoint_id, "table": error.table},
        )  # fmt: skip
        if on_damaged is not None:
            on_damaged(error)

    return report


def save(
    node: Node,
    checkpoint_id: str | None = None,
    keep: int = 3,
    on_damaged: OnDamaged | None = None,
    *,
    history_restarts: Collection[str] = (),
    tables: Collection[str] = (),
) -> CheckpointInfo:
    """Write the node's tables as one new checkpoint; keep the newest ``keep`` (of each
    table: see ``checkpoint_read.prune``).

    ``tables``: only these (a table of a pool is checkpointed alone); empty: every
    table. ``history_restarts``: tables whose state was just replaced (a Load), so no
    older checkpoint is a base for their log any more.
    """
    root = checkpoint_root(node)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with node.registry_lock:
        chosen = _chosen(node, tables)
        sequence = checkpoint_read.next_sequence(root)
        writer = checkpoint.CheckpointWriter(
            root,
            checkpoint_id or f"ckpt-{sequence:08d}",
            sequence,
            {"shard_index": node.shard_index, "num_shards": node.num_shards},
        )
        if tables:  # not every table: says nothing of the tables it does not hold
            writer.manifest["partial"] = True
        rotated: list[tuple[HostedTable, int]] = []
        written: dict[str, tuple[HostedTable, incremental.Written]] = {}
        try:
            for name, hosted in chosen:
                with hosted.lock:
                    written[name] = (hosted, _write_table(writer, name, hosted))
                    if hosted.wal is not None:
                        generation = hosted.wal.rotate()
                        writer.manifest["tables"][name]["wal_generation"] = generation
                        rotated.append((hosted, generation))
            info = writer.commit()
            # under the registry lock: the next save's increments build on this one
            for hosted, table in written.values():
                incremental.advance(hosted, info, table)
        except BaseException:
            writer.abort()
            _restart_chains(hosted for _, hosted in chosen)
            raise
    try:  # the log it would let go of is still whole: a bad write loses nothing
        checkpoint_read.verify(info, from_disk=True)
    except CheckpointCorrupt as error:
        shutil.rmtree(info.path, ignore_errors=True)
        _restart_chains(hosted for _, hosted in chosen)
        reporter(on_damaged)(error)
        raise CheckpointCorrupt(
            info.checkpoint_id, error.table, f"did not verify after writing ({error.reason})"
        ) from error
    checkpoint_read.prune(root, keep, protect=_holding_refused(node, root), tables=node.tables)
    _trim_logs(root, rotated, history_restarts)
    log.info(
        "checkpoint saved",
        extra={
            "checkpoint": info.checkpoint_id,
            "rows": info.rows,
            "bytes": info.bytes,
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    return info


def _chosen(node: Node, tables: Collection[str]) -> list[tuple[str, HostedTable]]:
    """The hosted tables a save writes, by name; TableNotFound naming any not hosted."""
    if not tables:
        return sorted(node.tables.items())
    missing = sorted(set(tables) - set(node.tables))
    if missing:
        raise TableNotFound(
            f"cannot checkpoint {', '.join(map(repr, missing))}: not hosted on this node"
        )
    return sorted((name, node.tables[name]) for name in set(tables))


def logged_generation(info: CheckpointInfo, entry: CatalogueEntry) -> int | None:
    """The log generation ``info`` records for this incarnation of the table (0: none);
    None when the checkpoint does not hold it."""
    meta = info.manifest["tables"].get(entry.spec.name)
    if meta is None or meta.get("incarnation") != entry.incarnation:
        return None
    return int(meta.get("wal_generation", 0))


def _trim_logs(
    root: Path, rotated: list[tuple[HostedTable, int]], history_restarts: Collection[str]
) -> None:
    """Delete each table's segments below what the oldest kept checkpoint needs: its
    generation, or 0 when it does not hold the table (created after it) or holds it
    without a log (written in checkpoint durability). A checkpoint of some tables only
    says nothing of the others."""
    kept = checkpoint_read.list_checkpoints(root)
    for hosted, generation in rotated:
        floor = generation
        if hosted.entry.spec.name not in history_restarts:
            needed = (
                logged_generation(info, hosted.entry) or 0
                for info in kept
                if not info.manifest.get("partial") or hosted.entry.spec.name in info.tables
            )
            floor = min(needed, default=generation)
        hosted.wal.remove_before(floor)  # type: ignore[union-attr]


def _holding_refused(node: Node, root: Path) -> set[str]:
    """Checkpoints holding a refused table: kept, they are all that is left of its data."""
    return {
        info.checkpoint_id
        for info in checkpoint_read.list_checkpoints(root)
        for refusal in node.refused.values()
        if logged_generation(info, refusal.entry) is not None
    }


def _restart_chains(tables: Iterable[HostedTable]) -> None:
    """A save that failed drained its tables' changes: their next checkpoint is a full one."""
    for hosted in tables:
        hosted.chain = None


def _write_table(
    writer: checkpoint.CheckpointWriter, name: str, hosted: HostedTable
) -> incremental.Written:
    table, spec = hosted.table, hosted.entry.spec
    return incremental.write_table(
        writer,
        name,
        hosted,
        dim=spec.embedding_dim,
        value_dtype=_value_dtype(hosted),
        state_width=spec.state_width,
        meta={
            **hosted.entry.to_dict(),
            "wal_generation": 0,
            "optimizer_state": table.optimizer_state(),
        },
    )


def _value_dtype(hosted: HostedTable) -> np.dtype:
    from recstore.ps.codec import wire_dtype

    return wire_dtype(hosted.dtype)


def restore_rows(hosted: HostedTable, info: CheckpointInfo, name: str) -> int:
    """Import a table's rows and optimizer state from a checkpoint whose chain verified;
    returns the rows the table then holds."""
    checkpoint_read.replay_chain(
        checkpoint_read.chain_of(info, name),
        name,
        rows=lambda chunk: hosted.table.import_chunk(*chunk),
        erase=hosted.table.erase,
    )
    hosted.table.load_optimizer_state(info.manifest["tables"][name].get("optimizer_state", {}))
    return hosted.table.size


def entry_of(meta: dict[str, Any]) -> CatalogueEntry:
    return CatalogueEntry.from_dict(meta)


def apply(hosted: HostedTable, record: WalRecord) -> None:
    """Apply one replayed log record to a table (and rebuild its de-dup window)."""
    if record.op == OP_PUSH:
        hosted.table.push(record.keys, record.values)
    elif record.op == OP_IMPORT:
        hosted.table.import_chunk(record.keys, record.values, record.state)
    elif record.op == OP_STEP:
        hosted.table.load_optimizer_state({"step": int(record.keys[0])})
    elif record.op == OP_ERASE:
        hosted.table.erase(record.keys)
    else:
        hosted.table.update(record.keys, record.values, record.lr)
    if record.request is not None:
        slots = slots_touched(record.keys)
        hosted.window.absorb([replace(record.request, slots=slots)])


def load(
    node: Node, checkpoint_id: str | None, keep: int = 3, on_damaged: OnDamaged | None = None
) -> CheckpointInfo:
    """Replace the checkpoint's tables by their saved state (other tables stay).

    The checkpoint is verified whole before anything changes: a damaged one is
    refused (CheckpointCorrupt) and the node keeps its state.
    """
    with node.registry_lock:
        info = checkpoint_read.find(checkpoint_root(node), checkpoint_id, reporter(on_damaged))
        for name, meta in info.manifest["tables"].items():
            if name in node.tables:
                with node.tables[name].lock:
                    node.unhost(name)
            hosted = node.host(entry_of(meta))
            restore_rows(hosted, info, name)
            if node.wal_enabled:
                hosted.wal = node.open_wal(hosted)
        node.save_catalogue()
        if node.wal_enabled:  # the logs now follow the loaded state: make it the newest base
            save(node, None, keep, on_damaged, history_restarts=set(info.manifest["tables"]))
    return info
