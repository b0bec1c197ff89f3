"""Crash recovery of a node's tables: verified checkpoints, then the write-ahead logs.

Each table is restored on its own, from the newest checkpoint that holds it
(same incarnation), whose files (and those of every link of its chain, when
it was saved incrementally) verify whole before a row is loaded and, in
WAL mode, whose log still reaches back to the generation it records; the log
is replayed from that generation. A log complete from generation 0 is a base
on its own. Every checkpoint passed over is said loudly: an error log line,
the node's ``recstore_ps_checkpoint_corrupt`` counter and a ``Recovered``
condition on the table. A table that had data but that nothing valid restores
is kept as refused (``Recovered=False``): its data calls fail with
FAILED_PRECONDITION until an operator loads a checkpoint or drops the table;
it never comes up empty as if new.
"""

from __future__ import annotations

import functools
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from recstore.core.proto_convert import TableCondition
from recstore.ps import catalogue, checkpoint_read, held_slots, wal_segments
from recstore.ps.catalogue import CatalogueEntry
from recstore.ps.checkpoint import CheckpointCorrupt, CheckpointInfo
from recstore.ps.node import Node
from recstore.ps.node_tables import Refusal
from recstore.ps.persistence import (
    OnDamaged,
    apply,
    checkpoint_root,
    entry_of,
    logged_generation,
    reporter,
    restore_rows,
)

log = logging.getLogger(__name__)

RECOVERED = "Recovered"  # the condition type


@dataclass
class Recovery:
    """What a start restored: the newest checkpoint used, and every table refused."""

    newest: CheckpointInfo | None = None
    refused: list[str] = field(default_factory=list)


def recover(node: Node, on_damaged: OnDamaged | None = None) -> Recovery:
    """Bring a starting node back: per table, the newest valid base and its log."""
    report = reporter(on_damaged)
    root = checkpoint_root(node)
    checkpoint_read.remove_temporaries(root)
    found = checkpoint_read.scan(root)
    for damaged in found.damaged:
        report(damaged)
    entries = catalogue.load(node.data_dir)
    if entries is None:  # a data dir of a release before the catalogue
        newest = found.infos[-1].manifest["tables"] if found.infos else {}
        entries = {name: entry_of(meta) for name, meta in newest.items()}
    outcome = Recovery()
    with node.registry_lock:
        for entry in entries.values():
            base = _recover_table(node, entry, found, report)
            if entry.spec.name in node.refused:
                outcome.refused.append(entry.spec.name)
            newest = outcome.newest
            if base is not None and (newest is None or base.sequence > newest.sequence):
                outcome.newest = base
        node.save_catalogue()
        held_slots.restore(node)
        if node.wal_enabled:
            live = {node.wal_dir(h.entry).name for h in node.tables.values()}
            live |= {node.wal_dir(r.entry).name for r in node.refused.values()}
            for stale in (node.data_dir / "wal").glob("*"):
                if stale.name not in live:
                    shutil.rmtree(stale, ignore_errors=True)
    return outcome


def _recover_table(
    node: Node, entry: CatalogueEntry, found: checkpoint_read.Scan, report: OnDamaged
) -> CheckpointInfo | None:
    """Host one table from its newest valid base (or refuse it); returns the checkpoint used."""
    name = entry.spec.name
    wal_dir = node.wal_dir(entry) if node.wal_enabled else None
    held = [i for i in reversed(found.infos) if logged_generation(i, entry) is not None]
    passed_over: list[str] = []
    reported: set[str] = set()
    for info in held:
        generation = logged_generation(info, entry) or 0
        if (
            wal_dir is not None
            and generation
            and not wal_segments.reaches_back(wal_dir, generation)
        ):
            passed_over.append(
                f"checkpoint {info.checkpoint_id!r}: the log no longer reaches back to "
                f"generation {generation}"
            )
            continue
        try:
            checkpoint_read.verify_chain(info, name)
        except CheckpointCorrupt as error:
            if str(error) not in reported:  # a damaged base is met again by each later link
                reported.add(str(error))
                report(error)
            link = error.checkpoint_id != info.checkpoint_id
            passed_over.append(
                f"checkpoint {info.checkpoint_id!r} ({error})" if link else str(error)
            )
            continue
        hosted = node.host(entry)
        restore_rows(hosted, info, name)
        how = f"restored from checkpoint {info.checkpoint_id!r}"
        if wal_dir is not None:
            how += _replay(node, entry, wal_dir, generation)
        elif passed_over:
            how += "; what only the passed-over checkpoints held is lost (no write-ahead log)"
        _note(node, name, passed_over, "FellBackToOlderCheckpoint", how)
        return info
    if wal_dir is not None and wal_segments.reaches_back(wal_dir, 0):
        node.host(entry)
        how = "restored from the write-ahead log alone" + _replay(node, entry, wal_dir, 0)
        _note(node, name, passed_over, "ReplayedLogFromStart", how)
        return None
    segments = wal_segments.generations(wal_dir) if wal_dir is not None else []
    if not (held or found.damaged or segments):  # never saved anywhere: new and empty
        node.host(entry)
        if wal_dir is not None:
            node.tables[name].wal = node.open_wal(entry)
        return None
    _refuse(node, entry, passed_over, found.damaged, segments)
    return None


def _replay(node: Node, entry: CatalogueEntry, wal_dir: Path, generation: int) -> str:
    hosted = node.tables[entry.spec.name]
    records = wal_segments.replay(
        wal_dir, generation, functools.partial(apply, hosted), hosted.window.absorb
    )
    hosted.wal = node.open_wal(entry)
    log.info("wal replayed", extra={"table": entry.spec.name, "records": records})
    return f" and replayed {records} log records from generation {generation}"


def _note(node: Node, name: str, passed_over: list[str], reason: str, how: str) -> None:
    """Say loudly that a table came back from other than its newest checkpoint."""
    if not passed_over:
        return
    message = f"table {name!r} {how}; passed over: {'; '.join(passed_over)}"
    node.conditions[name] = [TableCondition(RECOVERED, True, reason, message)]
    log.error("table restored from an older base", extra={"table": name, "reason": message})


def _refuse(
    node: Node,
    entry: CatalogueEntry,
    passed_over: list[str],
    damaged_manifests: list[CheckpointCorrupt],
    segments: list[int],
) -> None:
    name = entry.spec.name
    why = list(passed_over)
    why += [f"{d} (it may have held the table)" for d in damaged_manifests]
    if segments:
        why.append(f"the write-ahead log is incomplete (segments {segments[0]}..{segments[-1]})")
    reason = "NoValidCheckpoint" if passed_over or damaged_manifests else "LogIncomplete"
    message = (
        f"table {name!r} is not served: no valid checkpoint or complete log restores it "
        f"({'; '.join(why)}); repair its files, load a valid checkpoint or drop the table"
    )
    node.refused[name] = Refusal(entry, TableCondition(RECOVERED, False, reason, message))
    log.error("table refused", extra={"table": name, "reason": message})
