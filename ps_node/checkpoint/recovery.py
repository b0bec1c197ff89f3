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

Its log is verified as it is replayed (``recstore.ps.wal.segments``): a damaged
one (``WalDamaged``: a missing segment, a bad header, a damaged record, a
truncation; only a torn tail of the newest segment is cut) refuses the table
(``LogDamaged``), never serves what precedes the damage as if it were all. An
operator may then accept the loss explicitly (``recover_refused`` with
``accept_log_loss``, ``recstore.ps.wal.repair``): the table is served from the
intact prefix, and the reply says exactly what was dropped.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from recstore.core import TableNotFound
from recstore.core.errors import CheckpointCorrupt
from recstore.core.proto_convert import TableCondition, TableRecovery
from recstore.ps import catalogue
from recstore.ps.catalogue import CatalogueEntry
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.checkpoint.persistence import (
    OnDamaged,
    apply,
    checkpoint_root,
    entry_of,
    logged_generation,
    reporter,
    restore_rows,
)
from recstore.ps.checkpoint.write import CheckpointInfo
from recstore.ps.hosted_table import HostedTable
from recstore.ps.node import Node
from recstore.ps.reshard import held_slots
from recstore.ps.tables import Refusal
from recstore.ps.wal import repair as wal_repair
from recstore.ps.wal import segments as wal_segments
from recstore.ps.wal.repair import LogLoss
from recstore.ps.wal.verify import WalDamaged

log = logging.getLogger(__name__)

RECOVERED = "Recovered"  # the condition type
LOG_DAMAGED = "LogDamaged"  # its reason when the log is damaged


@dataclass
class Recovery:
    """What a start restored: the newest checkpoint used, and every table refused."""

    newest: CheckpointInfo | None = None
    refused: list[str] = field(default_factory=list)
    #: the refused tables whose log is damaged
    log_damaged: list[str] = field(default_factory=list)


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
            base, _ = _recover_table(node, entry, found, report)
            refusal = node.refused.get(entry.spec.name)
            if refusal is not None:
                outcome.refused.append(entry.spec.name)
                if refusal.condition.reason == LOG_DAMAGED:
                    outcome.log_damaged.append(entry.spec.name)
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


def recover_refused(
    node: Node, name: str, *, accept_log_loss: bool, on_damaged: OnDamaged | None = None
) -> TableRecovery:
    """Recover a table refused at start again (its files repaired meanwhile, or, with
    ``accept_log_loss``, from its log's intact prefix); still refused: the refusal."""
    report = reporter(on_damaged)
    with node.registry_lock:
        refusal = node.refused.get(name)
        if refusal is None:
            if name in node.tables:  # e.g. asked again, or a shard the damage spared
                return TableRecovery(name, "served already: nothing to recover")
            raise TableNotFound(f"table {name!r} is not hosted on this node")
        found = checkpoint_read.scan(checkpoint_root(node))
        losses: list[LogLoss] = []
        _, how = _recover_table(
            node, refusal.entry, found, report, losses if accept_log_loss else None
        )
        node.save_catalogue()
        still = node.refused.get(name)
        if still is not None:
            raise still.error
    if not losses:
        return TableRecovery(name, how)
    (loss,) = losses
    log.error(
        "table served without what followed damage in its log, as the operator accepted",
        extra={"table": name, "loss": loss.describe()},
    )
    return TableRecovery(
        name, how, loss.damage, loss.replayed, loss.dropped,
        str(loss.quarantine.relative_to(node.data_dir)),
    )  # fmt: skip


def _recover_table(
    node: Node,
    entry: CatalogueEntry,
    found: checkpoint_read.Scan,
    report: OnDamaged,
    losses: list[LogLoss] | None = None,
) -> tuple[CheckpointInfo | None, str]:
    """Host one table from its newest valid base (or refuse it); returns the checkpoint
    used and how the table came back.

    ``losses``: replay a damaged log up to the damage, cut it there and note the loss
    (the operator accepted it); None: refuse the table instead.
    """
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
        hosted = node.prepare(entry)  # served once whole
        with _discarded_unless_served(node, hosted):
            restore_rows(hosted, info, name)
            how = f"restored from checkpoint {info.checkpoint_id!r}"
            if wal_dir is not None:
                replayed = _replay(node, hosted, wal_dir, generation, losses)
                if replayed is None:
                    return None, ""
                how += replayed
            elif passed_over:
                how += "; what only the passed-over checkpoints held is lost (no write-ahead log)"
            node.serve(hosted)
        _note(node, name, passed_over, "FellBackToOlderCheckpoint", how)
        return info, how
    if wal_dir is not None and wal_segments.reaches_back(wal_dir, 0):
        hosted = node.prepare(entry)
        with _discarded_unless_served(node, hosted):
            replayed = _replay(node, hosted, wal_dir, 0, losses)
            if replayed is None:
                return None, ""
            node.serve(hosted)
        how = "restored from the write-ahead log alone" + replayed
        _note(node, name, passed_over, "ReplayedLogFromStart", how)
        return None, how
    segments = wal_segments.generations(wal_dir) if wal_dir is not None else []
    if not (held or found.damaged or segments):  # never saved anywhere: new and empty
        hosted = node.host(entry)
        if wal_dir is not None:
            hosted.wal = node.open_wal(hosted)
        return None, "created empty: it was never saved"
    _refuse(node, entry, passed_over, found.damaged, segments)
    return None, ""


@contextlib.contextmanager
def _discarded_unless_served(node: Node, hosted: HostedTable) -> Iterator[None]:
    """Drop a prepared table that recovery leaves without serving it (refused, failed)."""
    try:
        yield
    finally:
        if node.tables.get(hosted.entry.spec.name) is not hosted:
            node.discard(hosted)


def _replay(
    node: Node,
    hosted: HostedTable,
    wal_dir: Path,
    generation: int,
    losses: list[LogLoss] | None,
) -> str | None:
    """Replay the log from ``generation`` onto the prepared table and open it; None: the
    log is damaged and the table refused (unless ``losses`` takes the loss)."""
    entry = hosted.entry
    name = entry.spec.name
    try:
        replayed = wal_segments.replay(
            wal_dir, generation, functools.partial(apply, hosted), hosted.window.absorb,
            stop_at_damage=losses is not None,
        )  # fmt: skip
    except WalDamaged as damage:
        _refuse_log(node, entry, wal_dir, generation, damage)
        return None
    how = f" and replayed {replayed.records} log records from generation {generation}"
    if replayed.damage is not None and losses is not None:
        loss = wal_repair.cut(wal_dir, generation, replayed, node.data_dir)
        losses.append(loss)
        how = f" and, as the operator accepted, {loss.describe()}"
        node.conditions[name] = [
            TableCondition(RECOVERED, True, "AcceptedLogLoss", f"table {name!r} served{how}")
        ]
    hosted.wal = node.open_wal(
        hosted,
        first_generation=generation,
        predecessor_end=replayed.end if replayed.newest is not None else None,
    )
    log.info("wal replayed", extra={"table": name, "records": replayed.records})
    return how


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


def _refuse_log(
    node: Node, entry: CatalogueEntry, wal_dir: Path, generation: int, damage: WalDamaged
) -> None:
    name = entry.spec.name
    message = (
        f"table {name!r} is not served: no valid checkpoint or complete log restores it "
        f"(its write-ahead log {wal_dir.name}, replayed from generation {generation}, is "
        f"damaged: {damage}); repair the log, accept losing what follows the damage "
        f"(recstore recover {name} --accept-log-loss), load a valid checkpoint or drop the table"
    )
    node.refused[name] = Refusal(entry, TableCondition(RECOVERED, False, LOG_DAMAGED, message))
    log.error("table refused", extra={"table": name, "reason": message})
