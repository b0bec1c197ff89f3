"""The steps of a slot migration on one node, as the Migrat*/Seal*/SlotChecksums/SetSlotMap
RPCs run them (blocking; the servicer runs them on its thread pool).

Source: ``begin_outgoing``, ``snapshot_page`` (rows as of the start, paged),
``catch_up`` (rows changed since), ``seal`` (the tail), ``abort_outgoing``,
``cleanup`` (drop rows of slots no longer owned). Target: ``begin_import``,
``import_rows``, ``abort_import``. Both: ``checksums`` and ``set_slot_map``,
the compare-and-swap on the epoch that activates the target and makes the
source refuse the moved slots.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from recstore.core import InvalidArgument, SlotMap, slot_of
from recstore.core.limits import ROW_CHUNK_BYTES
from recstore.core.migration_wire import RowBatch
from recstore.ps import capacity, codec, dedup_log, migration, row_transfer
from recstore.ps.migration import MigrationConflict, keys_in, migrating_slots, rows_of
from recstore.ps.node import Node, Write, WriteAck, owned_slots
from recstore.ps.wal import OP_IMPORT
from recstore.store.table import Chunk


def _batch(
    chunk: Chunk, gone: np.ndarray, present: np.ndarray | None = None, following: int = 0
) -> RowBatch:
    return RowBatch(chunk.keys, chunk.values, chunk.state, gone, present, following)


class SlotMapConflict(MigrationConflict):
    """SetSlotMap's expected epoch is not the node's (the compare-and-swap failed)."""


def begin_outgoing(node: Node, name: str, ranges: list[tuple[int, int]], target: int) -> None:
    hosted = node.get(name)
    slots = migrating_slots(ranges)
    node.migrations.begin(name, slots, target, hosted.owned_slots)
    # the key list is read after tracking started: a row changed later is recorded
    node.migrations.outgoing[name].snapshot = np.sort(keys_in(hosted.table, slots))


def page_rows(node: Node, name: str, wanted: int) -> int:
    """Rows of one reply: ``wanted`` (0: any), within half the row-chunk budget, so a
    page fits a default gRPC receive limit whatever the row width."""
    budget = row_transfer.rows_per_chunk(node.get(name), True, ROW_CHUNK_BYTES // 2, 1 << 62)
    return min(wanted, budget) if wanted > 0 else budget


def snapshot_page(node: Node, name: str, offset: int, rows: int) -> RowBatch:
    hosted = node.get(name)
    keys = node.migrations.outgoing_of(name).snapshot
    if offset < 0 or rows < 0:
        raise InvalidArgument(f"snapshot page needs offset >= 0 and rows >= 0: {offset}, {rows}")
    want = keys[offset : offset + page_rows(node, name, rows)]
    chunk = hosted.table.export_keys(want)
    following = offset + len(want)
    # keys gone since the snapshot began were recorded (evictions) or will be in the tail
    return _batch(chunk, np.empty(0, np.int64), None, following if following < len(keys) else 0)


def _changed_page(node: Node, name: str, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """At most a page of ``keys``; the rest go back to the tracker (more: 1)."""
    page = page_rows(node, name, 0)
    if len(keys) <= page:
        return keys, 0
    node.migrations.outgoing_of(name).tracker.record(keys[page:])
    return keys[:page], 1


def catch_up(node: Node, name: str) -> RowBatch:
    """Rows changed since the previous call (a page; ``next_offset`` 1: more are pending)."""
    hosted = node.get(name)
    keys, more = _changed_page(node, name, node.migrations.changes(name))
    chunk, gone = rows_of(hosted.table, keys)
    return _batch(chunk, gone, None, more)


def seal(node: Node, name: str, timeout: float) -> RowBatch:
    """Seal the outgoing slots and return the tail: last changes and every resident key
    (``next_offset`` 1: more changes follow through ``catch_up``, still sealed)."""
    hosted = node.get(name)
    keys, more = _changed_page(node, name, node.migrations.seal(name, timeout))
    chunk, gone = rows_of(hosted.table, keys)
    out = node.migrations.outgoing_of(name)
    # the de-dup window moves with the slots: no update of them runs while sealed
    count, window = dedup_log.encode_entries(hosted.window.entries_touching(out.slots))
    tail = _batch(chunk, gone, keys_in(hosted.table, out.slots), more)
    return dataclasses.replace(tail, dedup_entries=window, dedup_entry_count=count)


def abort_outgoing(node: Node, name: str) -> bool:
    """Unseal and stop tracking; the source stays authoritative. False: nothing was moving."""
    return node.migrations.end(name) is not None


def cleanup(node: Node, name: str) -> int:
    """Drop the rows of slots this node no longer owns; returns how many."""
    hosted = node.get(name)
    if hosted.owned_slots is None:
        return 0
    if node.migrations.tracks(name):
        raise MigrationConflict(f"table {name!r} is still moving slots out; commit first")
    with hosted.lock:
        return hosted.table.erase(keys_in(hosted.table, ~hosted.owned_slots))


def begin_import(node: Node, name: str, ranges: list[tuple[int, int]]) -> None:
    """Grow the table to hold the slots it will own (``capacity``), then import them."""
    hosted = node.get(name)
    slots = migrating_slots(ranges)
    node.migrations.check_import(name, slots, hosted.owned_slots)
    capacity.reserve_for_import(node, name, slots)
    node.migrations.begin_import(name, slots, hosted.owned_slots)


def import_rows(node: Node, name: str, rows: RowBatch) -> WriteAck:
    """Apply rows from the source into importing slots; ``present`` (the tail) erases the rest.

    The rows are written like an ImportRows chunk (logged in WAL mode, so a restarted
    target replays them); erasures are not logged.
    """
    hosted = node.get(name)
    slots = node.migrations.importing_slots(name)
    for what, keys in (("row", rows.keys), ("gone key", rows.gone)):
        if len(keys) and not slots[slot_of(keys)].all():
            raise InvalidArgument(f"table {name!r}: a {what} lies outside the importing slots")
    with hosted.lock:
        ack = WriteAck(0)
        if len(rows.keys):
            apply = functools.partial(hosted.table.import_chunk, rows.keys, rows.values, rows.state)
            write = Write(
                hosted, OP_IMPORT, codec.encode(rows.keys), codec.encode(rows.values),
                hosted.dtype, None, apply, codec.encode(rows.state),
            )  # fmt: skip
            (ack,) = node.write_logged([write])
        erased = rows.gone
        if rows.present is not None:
            extra = np.setdiff1d(keys_in(hosted.table, slots), rows.present)
            erased = np.union1d(erased, extra)
        if len(erased):
            hosted.table.erase(erased)
    if rows.dedup_entry_count:
        entries = dedup_log.decode_entries(rows.dedup_entries, 0, rows.dedup_entry_count)
        node.absorb_window(name, entries)
    return ack


def abort_import(node: Node, name: str) -> int:
    """Discard what was imported (rows of any slot this node does not own: also what an
    import before a restart left); returns how many rows were dropped."""
    hosted = node.get(name)
    node.migrations.end_import(name)
    if hosted.owned_slots is None:
        return 0
    with hosted.lock:
        return hosted.table.erase(keys_in(hosted.table, ~hosted.owned_slots))


def checksums(node: Node, name: str, ranges: list[tuple[int, int]]) -> tuple[np.ndarray, ...]:
    return migration.slot_checksums(node.get(name).table, migrating_slots(ranges))


def set_slot_map(node: Node, name: str, expected_epoch: int, slot_map: SlotMap) -> bool:
    """Install ``slot_map`` if the node's epoch is ``expected_epoch`` (or already it).

    Returns False when the map was already installed (a resent commit). Moved-out
    slots are then refused (held requests re-check and get the wrong-owner error);
    imported slots are served.
    """
    with node.registry_lock:
        hosted = node.get(name)
        current = hosted.entry.slot_map
        if current == slot_map:
            return False
        if current.epoch != expected_epoch or slot_map.epoch != expected_epoch + 1:
            raise SlotMapConflict(
                f"table {name!r}: node is at slot-map epoch {current.epoch}, the new map "
                f"({slot_map.epoch}) must follow {expected_epoch}"
            )
        with hosted.lock:
            hosted.entry = dataclasses.replace(hosted.entry, slot_map=slot_map)
            hosted.owned_slots = owned_slots(slot_map, node.shard_index)
            node.save_catalogue()
        owned = hosted.owned_slots
        out = node.migrations.outgoing.get(name)
        if out is not None and (owned is None or not owned[out.slots].any()):
            abort_outgoing(node, name)  # committed: held requests now meet the new map
        incoming = node.migrations.importing.get(name)
        if incoming is not None and (owned is None or owned[incoming].all()):
            node.migrations.end_import(name)
    return True
