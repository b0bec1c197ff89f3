"""Save, load and crash recovery of a node's tables (checkpoints + write-ahead logs).

A save holds each table's lock while its rows stream to disk and, in WAL mode,
rotates that table's log at the same instant, so a checkpoint plus the log
segments from its recorded generation reproduce the table exactly. Recovery
on start: newest valid checkpoint, then the catalogue's tables, then the logs.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from recstore.core import SlotMap, TableSpec
from recstore.ps import catalogue, checkpoint
from recstore.ps.catalogue import CatalogueEntry
from recstore.ps.checkpoint import CheckpointInfo, CheckpointNotFound
from recstore.ps.node import HostedTable, Node
from recstore.ps.wal import OP_PUSH, WalRecord, replay

log = logging.getLogger(__name__)


def checkpoint_root(node: Node) -> Path:
    return node.data_dir / "checkpoints"


def save(node: Node, checkpoint_id: str | None = None, keep: int = 3) -> CheckpointInfo:
    """Write every table of the node as one new checkpoint; keep the newest ``keep``."""
    root = checkpoint_root(node)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with node.registry_lock:
        sequence = checkpoint.next_sequence(root)
        writer = checkpoint.CheckpointWriter(
            root,
            checkpoint_id or f"ckpt-{sequence:08d}",
            sequence,
            {"shard_index": node.shard_index, "num_shards": node.num_shards},
        )
        rotated: list[tuple[HostedTable, int]] = []
        try:
            for name, hosted in sorted(node.tables.items()):
                with hosted.lock:
                    _write_table(writer, name, hosted)
                    if hosted.wal is not None:
                        generation = hosted.wal.rotate()
                        writer.manifest["tables"][name]["wal_generation"] = generation
                        rotated.append((hosted, generation))
            info = writer.commit()
        except BaseException:
            writer.abort()
            raise
    for hosted, generation in rotated:
        hosted.wal.remove_before(generation)  # type: ignore[union-attr]
    checkpoint.prune(root, keep)
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


def _write_table(writer: checkpoint.CheckpointWriter, name: str, hosted: HostedTable) -> None:
    table, spec = hosted.table, hosted.entry.spec
    chunks = ((c.keys, c.values, c.state) for c in table.export_chunks())
    writer.add_table(
        name,
        chunks=chunks,
        dim=spec.embedding_dim,
        value_dtype=_value_dtype(hosted),
        state_width=spec.optimizer.state_width(spec.embedding_dim),
        meta={
            **hosted.entry.to_dict(),
            "wal_generation": 0,
            "optimizer_state": table.optimizer_state(),
        },
    )


def _value_dtype(hosted: HostedTable) -> np.dtype:
    from recstore.ps.codec import wire_dtype

    return wire_dtype(hosted.dtype)


def _restore_rows(hosted: HostedTable, info: CheckpointInfo, name: str) -> int:
    for keys, values, state in checkpoint.table_chunks(info, name):
        hosted.table.import_chunk(keys, values, state)
    hosted.table.load_optimizer_state(info.manifest["tables"][name].get("optimizer_state", {}))
    return int(info.manifest["tables"][name]["rows"])


def _entry_of(meta: dict[str, Any]) -> CatalogueEntry:
    return CatalogueEntry(
        TableSpec.model_validate(meta["spec"]),
        SlotMap.from_dict(meta["slot_map"]),
        str(meta["incarnation"]),
    )


def _apply(hosted: HostedTable, record: WalRecord) -> None:
    if record.op == OP_PUSH:
        hosted.table.push(record.keys, record.values)
    else:
        hosted.table.update(record.keys, record.values, record.lr)


def load(node: Node, checkpoint_id: str | None, keep: int = 3) -> CheckpointInfo:
    """Replace the checkpoint's tables by their saved state (other tables stay)."""
    with node.registry_lock:
        info = checkpoint.find(checkpoint_root(node), checkpoint_id)  # verified before any change
        for name, meta in info.manifest["tables"].items():
            if name in node.tables:
                with node.tables[name].lock:
                    node.unhost(name)
            hosted = node.host(_entry_of(meta))
            _restore_rows(hosted, info, name)
            if node.wal_enabled:
                hosted.wal = node.open_wal(hosted.entry)
        node.save_catalogue()
        if node.wal_enabled:  # the logs now follow the loaded state: make it the newest base
            save(node, None, keep)
    return info


def recover(node: Node) -> CheckpointInfo | None:
    """Bring a starting node back: newest valid checkpoint, catalogue, write-ahead logs."""
    root = checkpoint_root(node)
    checkpoint.remove_temporaries(root)
    try:
        info: CheckpointInfo | None = checkpoint.find(root, None)
    except CheckpointNotFound:
        info = None
    saved = info.manifest["tables"] if info else {}
    entries = catalogue.load(node.data_dir)
    if entries is None:
        entries = {name: _entry_of(meta) for name, meta in saved.items()}
    with node.registry_lock:
        for name, entry in entries.items():
            hosted = node.host(entry)
            start_generation = 0
            meta = saved.get(name)
            if meta is not None and meta["incarnation"] == entry.incarnation:
                _restore_rows(hosted, info, name)  # type: ignore[arg-type]
                start_generation = int(meta.get("wal_generation", 0))
            if node.wal_enabled:
                wal_dir = node.wal_dir(entry)
                replayed = replay(wal_dir, start_generation, functools.partial(_apply, hosted))
                hosted.wal = node.open_wal(entry)
                log.info("wal replayed", extra={"table": name, "records": replayed})
        node.save_catalogue()
        if node.wal_enabled:
            live = {node.wal_dir(h.entry).name for h in node.tables.values()}
            for stale in (node.data_dir / "wal").glob("*"):
                if stale.name not in live:
                    shutil.rmtree(stale, ignore_errors=True)
    return info
