"""The steps of a reshard on one node, as the Migrat*/Seal*/SlotChecksums/SetSlotMap
RPCs run them (blocking; the servicer runs them on its thread pool).

Source: ``begin_outgoing``, ``snapshot_page`` (rows as of the start, paged),
``catch_up`` (rows changed since), ``seal`` (the tail), ``abort_outgoing``,
``cleanup`` (drop rows of slots no longer owned). Target: ``begin_import``,
``import_rows``, ``abort_import``, ``importing_checksums``. Both: ``checksums`` and
``set_slot_map`` (``activate``: with the checksums at the install),
the compare-and-swap on the epoch that activates the target and makes the
source refuse the moved slots.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from recstore.core import InvalidArgument, SlotMap, slot_of
from recstore.core.errors import ReshardConflict, SlotMapConflict
from recstore.core.limits import ROW_CHUNK_BYTES
from recstore.core.reshard.messages import Checksums, RowBatch
from recstore.core.shard_rows import rows_for_slots
from recstore.ps import codec, row_transfer
from recstore.ps.capacity import owned_count
from recstore.ps.changes import distinct
from recstore.ps.hosted_table import HostedTable, owned_slots
from recstore.ps.node import Node, Write, WriteAck
from recstore.ps.reshard import held_slots, import_sums
from recstore.ps.reshard import slots as reshard_slots
from recstore.ps.reshard.slots import keys_in, resharding_slots, rows_of
from recstore.ps.wal import dedup_log
from recstore.ps.wal.records import OP_IMPORT
from recstore.store import Table
from recstore.store.table import Chunk


def _batch(
    chunk: Chunk, gone: np.ndarray, present: np.ndarray | None = None, following: int = 0
) -> RowBatch:
    return RowBatch(chunk.keys, chunk.values, chunk.state, gone, present, following)


#: encoded de-dup entries in one catch-up reply or tail, as ``page_rows`` bounds its rows
WINDOW_PAGE_BYTES = ROW_CHUNK_BYTES // 2


def begin_outgoing(node: Node, name: str, ranges: list[tuple[int, int]], target: int) -> None:
    hosted = node.get(name)
    slots = resharding_slots(ranges)
    node.reshards.begin(name, slots, target, hosted.owned_slots)
    # the key list is read after tracking started: a row changed later is recorded
    node.reshards.outgoing[name].snapshot = np.sort(keys_in(hosted.table, slots))


def page_rows(node: Node, name: str, wanted: int) -> int:
    """Rows of one reply: ``wanted`` (0: any), within half the row-chunk budget, so a
    page fits a default gRPC receive limit whatever the row width."""
    budget = row_transfer.rows_per_chunk(node.get(name), True, ROW_CHUNK_BYTES // 2, 1 << 62)
    return min(wanted, budget) if wanted > 0 else budget


def snapshot_page(node: Node, name: str, offset: int, rows: int) -> RowBatch:
    hosted = node.get(name)
    keys = node.reshards.outgoing_of(name).snapshot
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
    node.reshards.outgoing_of(name).tracker.record(keys[page:])
    return keys[:page], 1


def is_sealed(node: Node, name: str) -> bool:
    """Whether ``name`` has sealed slots here (its reads of changes are then the tail's)."""
    out = node.reshards.outgoing.get(name)
    return out is not None and out.sealed


def catch_up(node: Node, name: str) -> RowBatch:
    """Rows changed since the previous call (a page; ``next_offset`` 1: more are pending),
    with the de-dup entries of the slots recorded since (a page of them too)."""
    hosted = node.get(name)
    keys, more = _changed_page(node, name, node.reshards.changes(name))
    chunk, gone = rows_of(hosted.table, keys)
    count, window, more_entries = _window_since(hosted, node.reshards.outgoing_of(name))
    batch = _batch(chunk, gone, None, max(more, more_entries))
    return dataclasses.replace(batch, dedup_entries=window, dedup_entry_count=count)


def _window_since(hosted: HostedTable, out: reshard_slots.Outgoing) -> tuple[int, bytes, int]:
    """The de-dup entries of the moving slots not sent yet, encoded, and 1 when more are
    left for the next page (0: none). The window moves with the slots, most of it in the
    catch-up rounds, so the seal's tail carries only the rest. A page holds at most half
    the row-chunk budget (at least one entry): a trainer's requests each touch thousands
    of slots, and a window's worth of them is tens of megabytes. Each entry keeps only
    the moving slots: the target owns no other of the request's."""
    changed, now = hosted.window.changes_touching(out.slots, out.window_sent)
    encoded: list[bytes] = []
    size = 0
    for version, entry in changed:
        kept = dataclasses.replace(entry, slots=entry.slots[out.slots[entry.slots]])
        data = dedup_log.encode_entry(kept)
        if encoded and size + len(data) > WINDOW_PAGE_BYTES:
            return len(encoded), b"".join(encoded), 1
        encoded.append(data)
        size += len(data)
        out.window_sent = version
    out.window_sent = now
    return len(encoded), b"".join(encoded), 0


def seal(node: Node, name: str, timeout: float, with_checksums: bool = False) -> RowBatch:
    """Seal the outgoing slots and return the tail: last changes and every resident key
    (``next_offset`` 1: more changes follow through ``catch_up``, still sealed);
    ``with_checksums``: also the sealed slots' checksums, which nothing can change now."""
    hosted = node.get(name)
    keys, more = _changed_page(node, name, node.reshards.seal(name, timeout))
    out = node.reshards.outgoing_of(name)
    # a commit may follow at once: a restart must not serve these slots unsealed, so the
    # seal is on disk before the tail leaves; its fsyncs run while the tail is read
    with ThreadPoolExecutor(1, thread_name_prefix="seal-record") as disk:
        durable = disk.submit(held_slots.remember, node, name, out, hosted.entry.slot_map.epoch)
        chunk, gone = rows_of(hosted.table, keys)
        # the rest of the de-dup window: no update of the slots runs while sealed
        count, window, more_entries = _window_since(hosted, out)
        tail = _batch(chunk, gone, keys_in(hosted.table, out.slots), max(more, more_entries))
        sums = _checksums(hosted.table, out.slots) if with_checksums else None
        durable.result()
    return dataclasses.replace(tail, dedup_entries=window, dedup_entry_count=count, checksums=sums)


def abort_outgoing(node: Node, name: str) -> bool:
    """Unseal and stop tracking; the source stays authoritative. False: nothing was moving."""
    ended = node.reshards.end(name) is not None
    held_slots.forget(node, name)
    return ended


def cleanup(node: Node, name: str) -> int:
    """Drop the rows of slots this node no longer owns; returns how many."""
    hosted = node.get(name)
    if hosted.owned_slots is None:
        return 0
    if node.reshards.tracks(name):
        raise ReshardConflict(f"table {name!r} is still moving slots out; commit first")
    return _erase_unowned(node, hosted)


def _erase_unowned(node: Node, hosted: HostedTable) -> int:
    """Drop (logged) the rows of every slot the node does not own; returns how many."""
    assert hosted.owned_slots is not None
    with hosted.lock:
        unowned = keys_in(hosted.table, ~hosted.owned_slots)
        erased, ack = row_transfer.erase_logged(node, hosted, unowned)
    row_transfer.wait_durable(ack)
    return erased


def _reserve_for_import(node: Node, name: str, incoming: np.ndarray) -> int:
    """Grow ``name`` to hold the rows of the slots it owns plus ``incoming`` (a mask),
    recording the size durably before the import starts; returns the capacity.

    CapacityExhausted (nothing changed) where the table cannot grow (``Table.reserve``).
    """
    with node.registry_lock:
        hosted = node.get(name)
        count = owned_count(hosted.entry.slot_map, node.shard_index, incoming)
        if not hosted.table.reserve(rows_for_slots(hosted.entry.spec, count)):
            return hosted.table.capacity
        with hosted.lock:
            reserved = hosted.table.capacity
            hosted.entry = dataclasses.replace(hosted.entry, reserved_rows=reserved)
            node.save_catalogue()
        return reserved


def begin_import(node: Node, name: str, ranges: list[tuple[int, int]]) -> None:
    """Grow the table to hold the slots it will own (``capacity``), then import them."""
    hosted = node.get(name)
    slots = resharding_slots(ranges)
    node.reshards.check_import(name, slots, hosted.owned_slots)
    _reserve_for_import(node, name, slots)
    node.reshards.begin_import(name, slots, hosted.owned_slots)
    with hosted.lock:  # one pass now, so that the tail's checksums cost the tail's rows
        running = import_sums.start(hosted.table, slots)
        if running is not None:
            node.reshards.import_sums[name] = running


def _running_sums(node: Node, name: str, hosted: HostedTable) -> import_sums.RunningSums | None:
    """The importing slots' running sums while they still hold (caller holds the lock)."""
    running = node.reshards.import_sums.get(name)
    if running is not None and not running.holds(hosted.table):
        node.reshards.import_sums.pop(name, None)
        return None
    return running


def import_rows(node: Node, name: str, rows: RowBatch) -> WriteAck:
    """Apply rows from the source into importing slots; ``present`` (the tail) erases the rest.

    The rows are written like an ImportRows chunk and the erasures as erase records
    (both logged in WAL mode, so a restarted target replays them in order).
    """
    hosted = node.get(name)
    slots = node.reshards.importing_slots(name)
    for what, keys in (("row", rows.keys), ("gone key", rows.gone)):
        if len(keys) and not slots[slot_of(keys)].all():
            raise InvalidArgument(f"table {name!r}: a {what} lies outside the importing slots")
    with hosted.lock:
        running = _running_sums(node, name, hosted)
        try:
            ack = _import_locked(node, hosted, slots, rows, running)
        except BaseException:  # half an import: what its rows hash to now is not known
            node.reshards.import_sums.pop(name, None)
            raise
    if rows.dedup_entry_count:
        entries = dedup_log.decode_entries(rows.dedup_entries, 0, rows.dedup_entry_count)
        node.absorb_window(name, entries)
    return ack


def _import_locked(
    node: Node,
    hosted: HostedTable,
    slots: np.ndarray,
    rows: RowBatch,
    running: import_sums.RunningSums | None,
) -> WriteAck:
    """``import_rows`` under the table's lock, keeping ``running`` (if any) up to date."""
    touched = distinct(np.concatenate((rows.keys, rows.gone)))
    if running is not None:
        running.take_out(touched)
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
        extra = reshard_slots.keys_not_in(keys_in(hosted.table, slots), rows.present)
        if len(extra):
            if running is not None:  # untouched by this import: their hashes as they were
                running.take_out(extra[~np.isin(extra, touched)])
            erased = distinct(np.concatenate((erased, extra)))
    if len(erased):  # logged after the rows: its record settles both
        gone_rows, erase_ack = row_transfer.erase_logged(node, hosted, erased)
        ack = WriteAck(ack.rows, erase_ack.wal, erase_ack.seq)
        if running is not None:
            running.erased(gone_rows)
    if running is not None:
        running.put_in(touched)
    return ack


def abort_import(node: Node, name: str) -> int:
    """Discard what was imported (rows of any slot this node does not own: also what an
    import before a restart left); returns how many rows were dropped."""
    hosted = node.get(name)
    node.reshards.end_import(name)
    if hosted.owned_slots is None:
        return 0
    return _erase_unowned(node, hosted)


def _checksums(table: Table, slots: np.ndarray) -> Checksums:
    return Checksums(*reshard_slots.slot_checksums(table, slots))


def checksums(node: Node, name: str, ranges: list[tuple[int, int]]) -> Checksums:
    return _checksums(node.get(name).table, resharding_slots(ranges))


def importing_checksums(node: Node, name: str) -> Checksums:
    """Checksums of the slots this node imports (the target's, to verify a tail)."""
    hosted = node.get(name)
    slots = node.reshards.importing_slots(name)
    with hosted.lock:  # no import half applied
        return _importing_checksums(node, name, hosted, slots)


def _importing_checksums(
    node: Node, name: str, hosted: HostedTable, slots: np.ndarray
) -> Checksums:
    """Checksums of ``slots`` (caller holds the table's lock): the running sums while they
    hold (``import_sums``), so no pass over the batch's rows runs in the write pause."""
    running = _running_sums(node, name, hosted)
    if running is not None and np.array_equal(running.slots, slots):
        return running.checksums()
    return _checksums(hosted.table, slots)


def set_slot_map(node: Node, name: str, expected_epoch: int, slot_map: SlotMap) -> bool:
    """Install ``slot_map`` if the node's epoch is ``expected_epoch`` (or already it).

    Returns False when the map was already installed (a resent commit). Moved-out
    slots are then refused (held requests re-check and get the wrong-owner error);
    imported slots are served.
    """
    return activate(node, name, expected_epoch, slot_map, None).changed


@dataclasses.dataclass(frozen=True)
class Activation:
    """What installing a map did: ``changed`` (False: it was installed already), the
    checksums asked for, and how long moved-out slots held writes (a source; else 0)."""

    changed: bool
    checksums: Checksums | None = None
    held_s: float = 0.0


def activate(
    node: Node,
    name: str,
    expected_epoch: int,
    slot_map: SlotMap,
    checksum_ranges: list[tuple[int, int]] | None,
) -> Activation:
    """``set_slot_map``, also returning the checksums of ``checksum_ranges`` (None: none)
    taken in the same hold of the table as the install: a target's activation checksums.

    Until the install the target does not own the slots, so clients' writes to them are
    refused, and imports take the same lock; only an eviction forced by new rows of other
    slots (a hashed table at capacity) could still touch them in between.
    """
    wanted = None if not checksum_ranges else resharding_slots(checksum_ranges)
    with node.registry_lock:
        hosted = node.get(name)
        current = hosted.entry.slot_map
        if current == slot_map:
            if wanted is None:
                return Activation(False)
            with hosted.lock:
                return Activation(False, _checksums(hosted.table, wanted))
        if current.epoch != expected_epoch or slot_map.epoch != expected_epoch + 1:
            raise SlotMapConflict(
                f"table {name!r}: node is at slot-map epoch {current.epoch}, the new map "
                f"({slot_map.epoch}) must follow {expected_epoch}"
            )
        held = 0.0
        with hosted.lock, ThreadPoolExecutor(1, thread_name_prefix="catalogue") as disk:
            entry = dataclasses.replace(hosted.entry, slot_map=slot_map)
            # the map's fsyncs run while a target's checksums are taken (in the same hold)
            durable = disk.submit(node.save_catalogue, {name: entry})
            sums = None if wanted is None else _importing_checksums(node, name, hosted, wanted)
            hosted.entry = entry
            hosted.owned_slots = owned = owned_slots(slot_map, node.shard_index)
            out = node.reshards.outgoing.get(name)
            moved_out = out is not None and (owned is None or not owned[out.slots].any())
            if out is not None and moved_out:
                # committed: held requests meet the new map now and are refused, nothing
                # applied, so the write pause ends before the fsyncs below. Killed before
                # the catalogue is durable, the node comes back at the old map with the
                # seal on disk: sealed, as it was.
                node.reshards.end(name)
                held = time.monotonic() - out.sealed_at if out.sealed else 0.0
            durable.result()
        if moved_out:
            held_slots.forget(node, name)
        incoming = node.reshards.importing.get(name)
        if incoming is not None and (owned is None or owned[incoming].all()):
            node.reshards.end_import(name)
    return Activation(True, sums, held)
