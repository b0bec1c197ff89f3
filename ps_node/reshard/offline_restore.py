"""Offline resharding: restore tables into a node from checkpoints taken at another shard count.

Each source is the checkpoint directory of one old shard. Every table's old
shards must all be there, exactly once, and every source file must verify
before a row is read, so a damaged or incomplete set refuses the whole restore
with the node unchanged. The node then keeps, per table, only the rows of the
slots it owns under the table's new slot map (contiguous ranges over this
node's shard count, the old epoch plus one), each slot's rows taken from the old
shard that owned it (a checkpoint taken during a move also holds copies of slots
its node did not own); optimizer state rows travel with their keys. The result
is written as the node's own newest checkpoint, so a restart finds it and, in
WAL mode, the table's log starts from it. This is also the disaster-recovery
path: restore a fleet from the checkpoints it left. A source saved
incrementally is restored through its chain (its bases read from beside it,
every link verified first).

A restore may also open the tables in another mode than they were saved in
(``mode``): a training fleet's checkpoint restored with ``mode=inference``
gives a serving fleet whose tables hold the trained rows and no optimizer
state (the state in the checkpoint is dropped); ``mode=training`` restores
an inference checkpoint for training, the optimizer state starting afresh.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recstore.core import InvalidArgument, SlotMap, TableExists, TableMode, TableSpec, slot_of
from recstore.core.errors import CheckpointCorrupt, CheckpointNotFound
from recstore.ps.catalogue import CatalogueEntry
from recstore.ps.checkpoint import persistence
from recstore.ps.checkpoint import read as checkpoint_read
from recstore.ps.checkpoint.persistence import OnDamaged
from recstore.ps.checkpoint.write import MANIFEST, CheckpointInfo, Chunk
from recstore.ps.hosted_table import HostedTable, owned_slots
from recstore.ps.node import Node


@dataclass
class TableSources:
    """One table as the old fleet left it: its entry and the checkpoints holding its shards."""

    entry: CatalogueEntry
    infos: list[CheckpointInfo]


def default_root(node: Node) -> Path:
    """Sources must lie under this unless another root is given: the node's data dir's parent
    (where the local platform keeps the sibling shards' dirs)."""
    return node.data_dir.resolve().parent


def read_source(path: Path, allowed_root: Path) -> CheckpointInfo:
    """The checkpoint at ``path``, refused unless it lies under ``allowed_root`` (manifest
    verified, files not yet)."""
    resolved = Path(path).resolve()  # links and ".." cannot step outside the root
    if not resolved.is_relative_to(allowed_root.resolve()):
        raise InvalidArgument(f"restore source {path} is not under the allowed root {allowed_root}")
    if not (resolved / MANIFEST).is_file():
        raise CheckpointNotFound(f"restore source {path} is not a checkpoint (no {MANIFEST})")
    return checkpoint_read.read_manifest(resolved)


def _check_chain(chain: Sequence[CheckpointInfo], allowed_root: Path) -> None:
    """The bases of an incremental source must lie under the allowed root too."""
    for link in chain:
        if not link.path.resolve().is_relative_to(allowed_root.resolve()):
            raise InvalidArgument(f"restore source base {link.path} is not under {allowed_root}")


def _old_shard(info: CheckpointInfo) -> int:
    return int(info.manifest["node"]["shard_index"])


def group_tables(infos: Sequence[CheckpointInfo]) -> dict[str, TableSources]:
    """Each table of the sources, checked: one spec and slot map, every old shard once."""
    found: dict[str, list[tuple[CheckpointInfo, dict[str, Any]]]] = {}
    for info in infos:
        for name, meta in info.manifest["tables"].items():
            found.setdefault(name, []).append((info, meta))
    tables = {}
    for name, held in sorted(found.items()):
        first = persistence.entry_of(held[0][1])
        for info, meta in held[1:]:
            other = persistence.entry_of(meta)
            if other.spec != first.spec or other.slot_map != first.slot_map:
                raise InvalidArgument(
                    f"table {name!r}: checkpoint {info.checkpoint_id!r} holds another spec or "
                    f"slot map than {held[0][0].checkpoint_id!r}; the sources are not one fleet"
                )
        shards = sorted(_old_shard(info) for info, _ in held)
        expected = list(range(first.slot_map.num_shards))
        if shards != expected:
            raise InvalidArgument(
                f"table {name!r}: the sources hold old shards {shards}, not each of "
                f"{expected} exactly once; every old shard's checkpoint is needed"
            )
        tables[name] = TableSources(first, [info for info, _ in held])
    return tables


def resharded_entry(
    entry: CatalogueEntry, num_shards: int, mode: TableMode | None = None
) -> CatalogueEntry:
    """The table as this fleet serves it: its shard count (and ``mode``, when given), a
    new map and incarnation."""
    changes: dict[str, Any] = {"shards": num_shards}
    if mode is not None:
        changes["mode"] = TableMode(mode)
    spec = TableSpec.model_validate({**entry.spec.model_dump(), **changes})
    ranges = SlotMap.initial(num_shards).ranges
    slot_map = SlotMap(epoch=entry.slot_map.epoch + 1, ranges=ranges)
    return CatalogueEntry(spec, slot_map, uuid.uuid4().hex[:12])


def _import_owned(node: Node, hosted: HostedTable, sources: TableSources) -> int:
    """Import the rows of owned slots from every source (its chain replayed, when it was
    saved incrementally); returns how many rows the table then holds.

    Each slot's rows come from the old shard that owned it alone: a checkpoint taken
    during a move also holds rows of slots its node did not own (a target's import
    not yet committed, a source's moved slots not yet cleaned up), and those copies
    may be stale. A source's erasures are kept to its own slots for the same reason.
    """
    owned = owned_slots(hosted.entry.slot_map, node.shard_index)
    spec = hosted.entry.spec
    name, step = spec.name, 0
    for info in sources.infos:
        theirs = sources.entry.slot_map.owner_table() == _old_shard(info)
        keep = theirs if owned is None else theirs & owned

        def rows(chunk: Chunk, keep: np.ndarray = keep) -> None:
            keys, values, state = chunk
            mine = keep[slot_of(keys)]
            keys, values, state = keys[mine], values[mine], state[mine]
            if not len(keys):
                return
            if state.shape[1] == spec.state_width:
                hosted.table.import_chunk(keys, values, state)
            else:  # restored in another mode: the saved state does not apply
                hosted.table.push(keys, values)

        def erase(keys: np.ndarray, theirs: np.ndarray = theirs) -> None:
            hosted.table.erase(keys[theirs[slot_of(keys)]])

        chain = checkpoint_read.chain_of(info, name)
        checkpoint_read.replay_chain(chain, name, rows, erase)
        saved = info.manifest["tables"][name].get("optimizer_state", {})
        step = max(step, int(saved.get("step", 0)))
    if not spec.inference:
        # each old shard counted only the updates that reached it: the furthest one is kept
        hosted.table.load_optimizer_state({"step": step})
    return hosted.table.size


def restore(
    node: Node,
    sources: Sequence[Path],
    *,
    allowed_root: Path | None = None,
    keep: int = 3,
    on_damaged: OnDamaged | None = None,
    mode: TableMode | None = None,
) -> CheckpointInfo:
    """Host the sources' tables on ``node``, resharded (and opened in ``mode``, when
    given); returns the checkpoint written.

    Refused, with the node unchanged: a source outside the allowed root, a damaged
    or missing one, an incomplete or mixed set, or a table the node already hosts.
    """
    if not sources:
        raise InvalidArgument("restore needs at least one source checkpoint")
    root = allowed_root if allowed_root is not None else default_root(node)
    report = persistence.reporter(on_damaged)
    infos = [read_source(path, root) for path in sources]
    if len({info.path for info in infos}) != len(infos):
        raise InvalidArgument("a restore source is named twice")
    tables = group_tables(infos)
    for info in infos:
        try:
            for name in info.tables:
                _check_chain(checkpoint_read.verify_chain(info, name), root)
        except CheckpointCorrupt as error:
            report(error)
            raise
    with node.registry_lock:
        hosted_already = sorted(set(tables) & set(node.tables))
        if hosted_already:
            raise TableExists(
                f"tables {hosted_already} are hosted on this node; drop them before a restore"
            )
        refused = dict(node.refused)  # a restore may repair a table recovery refused
        restored: list[HostedTable] = []
        try:
            for sourced in tables.values():
                hosted = node.host(resharded_entry(sourced.entry, node.num_shards, mode))
                restored.append(hosted)
                _import_owned(node, hosted, sourced)
            if node.wal_enabled:
                for hosted in restored:
                    hosted.wal = node.open_wal(hosted)
            node.save_catalogue()
        except BaseException:
            for hosted in restored:
                node.unhost(hosted.entry.spec.name)
            node.refused = refused
            raise
        # written in both modes: the catalogue now names tables no older checkpoint holds
        return persistence.save(node, None, keep, on_damaged, history_restarts=set(tables))


def restore_data_dir(
    data_dir: Path,
    sources: Sequence[Path],
    *,
    shard_index: int,
    num_shards: int,
    durability: str = "checkpoint",
    allowed_root: Path | None = None,
    keep: int = 3,
    device: str = "cpu",
    mode: TableMode | None = None,
) -> CheckpointInfo:
    """Restore into the data dir of a stopped node (``recstore restore``).

    The dir is locked as a running node would lock it, so a node serving it refuses
    the restore; what the dir already holds is recovered first and kept.
    """
    from recstore.core.data_dir import DataDirLock
    from recstore.ps.checkpoint import recovery

    lock = DataDirLock.acquire(data_dir)
    try:
        node = Node(
            data_dir,
            shard_index=shard_index,
            num_shards=num_shards,
            device=device,
            wal_enabled=durability == "wal",
        )
        recovery.recover(node)
        try:
            return restore(node, sources, allowed_root=allowed_root, keep=keep, mode=mode)
        finally:
            for name in list(node.tables):
                node.unhost(name)  # closes the logs
    finally:
        lock.release()
