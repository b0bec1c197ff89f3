"""Incremental checkpoints: a table saved as the rows changed since its previous checkpoint.

Policy (``spec.checkpoint.full_every`` = N): a table is saved whole, then up to
N - 1 times as an increment over the checkpoint before, then whole again. The
table's ``ChangeTracker`` (the one resharding uses, over every slot) lists the
keys written since the previous save; the increment holds the current rows of
those keys with their optimizer state, rows that appeared meanwhile (a pull's
insert is not recorded where the table never drops rows on its own), and, as
``deleted.bin``, the keys the previous checkpoint held that are gone (evicted,
expired or erased). The table's optimizer step count is saved in every link.

The manifest of an increment records its chain per table: every base's id and
manifest sha256, full one first. Restore replays the chain in order and
verifies every link first (``recstore.ps.checkpoint.read.verify_chain``); a
link that is damaged or missing makes the checkpoint unusable like a damaged
full one, so recovery falls back to an older checkpoint (the newest whose
chain is whole). Pruning spares every base of a kept checkpoint, and the log
is trimmed below the oldest checkpoint kept, so it reaches back to the full
base of every kept chain.

A chain only continues what this node wrote: a table newly hosted (created,
recovered, loaded, restored) and a save that failed start with a full one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from recstore.ps.changes import distinct
from recstore.ps.checkpoint.read import CHAIN
from recstore.ps.checkpoint.write import MANIFEST_DIGEST, CheckpointInfo, CheckpointWriter, Chunk
from recstore.ps.hosted_table import ChainTip, HostedTable

EXPORT_ROWS = 65536  # changed rows read from the engine at a time


@dataclass
class Written:
    """A table written into a checkpoint not yet committed."""

    links: list[dict[str, str]]  # its bases (none when written whole)
    keys: np.ndarray


def write_table(writer: CheckpointWriter, name: str, hosted: HostedTable, **table: Any) -> Written:
    """Add ``hosted`` to ``writer``, whole or as an increment (caller holds its lock).

    ``table``: ``CheckpointWriter.add_table``'s other arguments (dim, dtype, meta).
    """
    changed = hosted.changes.drain() if hosted.changes is not None else None
    tip = hosted.chain
    meta = table.pop("meta")
    if changed is None:  # saved whole every time: nothing to build on
        writer.add_table(name, chunks=_whole(hosted, None), meta=meta, **table)
        return Written([], np.empty(0, np.int64))
    if tip is None or not _continues(writer, hosted, tip):
        seen: list[np.ndarray] = []
        writer.add_table(name, chunks=_whole(hosted, seen), meta=meta, **table)
        keys = distinct(np.concatenate(seen)) if seen else np.empty(0, np.int64)
        return Written([], keys)
    now = distinct(hosted.table.keys())
    wanted = distinct(np.concatenate([changed, np.setdiff1d(now, tip.keys, assume_unique=True)]))
    exported: list[np.ndarray] = []
    writer.add_table(
        name,
        chunks=_rows_of(hosted, wanted, exported),
        meta={**meta, CHAIN: tip.links},
        deleted=np.setdiff1d(tip.keys, now, assume_unique=True),
        **table,
    )
    # a row a concurrent pull inserted is in the checkpoint even when ``now`` missed it
    return Written(tip.links, distinct(np.concatenate([now, *exported])))


def _continues(writer: CheckpointWriter, hosted: HostedTable, tip: ChainTip) -> bool:
    """Whether the next checkpoint may be an increment over ``tip`` (else a full one)."""
    if len(tip.links) >= hosted.entry.spec.checkpoint.full_every:
        return False
    return all((writer.root / link["checkpoint_id"]).is_dir() for link in tip.links)


def _whole(hosted: HostedTable, seen: list[np.ndarray] | None) -> Iterator[Chunk]:
    for chunk in hosted.table.export_chunks():
        if seen is not None:
            seen.append(np.asarray(chunk.keys, dtype=np.int64))
        yield chunk.keys, chunk.values, chunk.state


def _rows_of(hosted: HostedTable, keys: np.ndarray, exported: list[np.ndarray]) -> Iterator[Chunk]:
    for start in range(0, len(keys), EXPORT_ROWS):
        chunk = hosted.table.export_keys(keys[start : start + EXPORT_ROWS])  # resident ones
        exported.append(np.asarray(chunk.keys, dtype=np.int64))
        yield chunk.keys, chunk.values, chunk.state


def advance(hosted: HostedTable, info: CheckpointInfo, written: Written) -> None:
    """The checkpoint holding ``written`` is committed and verified: the next builds on it."""
    if hosted.changes is None:
        return
    link = {"checkpoint_id": info.checkpoint_id, MANIFEST_DIGEST: info.manifest[MANIFEST_DIGEST]}
    hosted.chain = ChainTip([*written.links, link], written.keys)


def kind_of(info: CheckpointInfo, name: str) -> str:
    """``full`` or ``incremental``: how ``info`` holds table ``name``."""
    return "incremental" if info.manifest["tables"][name].get(CHAIN) else "full"
