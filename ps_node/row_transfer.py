"""ExportRows / ImportRows on a node: a table's rows with their optimizer state, in chunks.

Moving a table's rows elsewhere (resharding, an SDK ``state_dict`` with
optimizer state, a copy between clusters) needs more than Pull/Push: the
rows' optimizer state must travel with them, and a table may be far larger
than one message. An export streams the resident rows (optionally only those
of some slots) in chunks of bounded bytes; an import checks each chunk whole
(dtype, dim, state width, lengths, slot ownership) before any of its rows is
applied and writes it through ``Node.write_logged``, so in WAL mode it is
logged and replayed like a Push; while its slots move to another node it is
held and tracked like a Push too (``recstore.ps.reshard.slots``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from recstore.core import DType, InvalidArgument, wire
from recstore.core.limits import ROW_CHUNK_BYTES
from recstore.core.routing import slot_mask
from recstore.ps import codec
from recstore.ps.hosted_table import HostedTable, check_owned
from recstore.ps.node import Node, Write, WriteAck
from recstore.ps.wal.records import OP_ERASE, OP_IMPORT, OP_PUSH, OP_STEP

#: room for a chunk message's fields beyond its three buffers (tags, name, dtype)
CHUNK_OVERHEAD_BYTES = 4096
STATE_DTYPE = DType.float32.value


@dataclass(frozen=True)
class ExportedChunk:
    """One chunk of an export, as raw little-endian bytes ready for the wire."""

    keys: bytes
    values: bytes
    state: bytes
    state_width: int

    @property
    def rows(self) -> int:
        return len(self.keys) // codec.KEY_DTYPE.itemsize


def slot_mask_of(raw: bytes) -> np.ndarray | None:
    """The bool slot mask of a request (one byte per slot); None (every slot) when empty."""
    return slot_mask(np.frombuffer(raw, np.uint8) != 0) if raw else None


def rows_per_chunk(hosted: HostedTable, with_state: bool, max_bytes: int, limit: int) -> int:
    """Rows of one chunk: within ``max_bytes`` (0: the default) and the reply limit."""
    if max_bytes < 0:
        raise InvalidArgument(f"max_chunk_bytes must be >= 0, got {max_bytes}")
    budget = min(max_bytes or ROW_CHUNK_BYTES, limit - CHUNK_OVERHEAD_BYTES)
    width = hosted.entry.spec.state_width if with_state else 0
    row_bytes = codec.KEY_DTYPE.itemsize + hosted.entry.spec.row_bytes + 4 * width
    return max(1, budget // row_bytes)


def export_rows(
    node: Node,
    name: str,
    *,
    with_state: bool,
    slot_mask: bytes = b"",
    keys: wire.Buffer = b"",
    max_chunk_bytes: int = 0,
    reply_limit: int,
) -> Iterator[ExportedChunk]:
    """The table's resident rows (of ``keys``, when given) in chunks; every argument is
    checked before the first (keys of slots another shard owns are refused).

    Not under the table lock: each chunk is read under the engine's lock, so a row
    is never torn, and rows written during the export come out in either state.
    """
    hosted = node.get(name)
    slots = slot_mask_of(slot_mask)
    rows = rows_per_chunk(hosted, with_state, max_chunk_bytes, reply_limit)
    width = hosted.entry.spec.state_width if with_state else 0
    wanted = None
    if len(keys):
        wanted = codec.decode_keys(keys)
        check_owned(hosted, wanted)
    chunks = hosted.table.export_chunks(rows, slots=slots, keys=wanted)
    return (
        ExportedChunk(
            codec.encode(chunk.keys),
            codec.encode(chunk.values),
            codec.encode(chunk.state) if width else b"",
            width,
        )
        for chunk in chunks
    )


def import_rows(
    node: Node,
    name: str,
    keys_buffer: wire.Buffer,
    values_buffer: wire.Buffer,
    state_buffer: wire.Buffer,
    *,
    dtype: str,
    dim: int,
    state_width: int,
    optimizer_step: int | None = None,
) -> WriteAck:
    """Write one chunk: values and optimizer state, or values alone when ``state`` is empty.

    A values-only chunk assigns rows as a Push does (a resident row keeps its
    optimizer state, a new one starts from none); this is how a training table's
    rows load into an inference table, which holds no state. ``optimizer_step``
    then sets the table's step count (logged with the rows, applied after them).
    """
    hosted = node.get(name)
    codec.check_declared(dtype, dim, hosted.dtype, hosted.dim)
    keys = codec.decode_keys(keys_buffer)
    values = codec.decode_rows(values_buffer, len(keys), hosted.dim, hosted.dtype)
    table_width = hosted.entry.spec.state_width
    if state_width or len(state_buffer):
        if state_width != table_width:
            raise InvalidArgument(
                f"state_width {state_width} does not match the table's {table_width} "
                f"(table {name!r}; send values alone to load rows without optimizer state)"
            )
        state = codec.decode_rows(state_buffer, len(keys), table_width, STATE_DTYPE, "state")
        op, apply = OP_IMPORT, functools.partial(hosted.table.import_chunk, keys, values, state)
    else:
        op, apply = OP_PUSH, functools.partial(hosted.table.push, keys, values)
    writes = [
        Write(hosted, op, keys_buffer, values_buffer, hosted.dtype, None, apply, state_buffer)
    ]
    if optimizer_step is not None:
        writes.append(step_write(hosted, optimizer_step))
    # like a Push: held while its slots are sealed, and tracked while they move out
    with node.reshards.admitted(name, keys, hosted.entry.slot_map.epoch):
        check_owned(hosted, keys)
        with hosted.lock:
            acks = node.write_logged(writes)
        node.reshards.record(name, keys)
    # the rows' count, and the last record: once it is durable, so is every one before it
    return WriteAck(acks[0].rows, acks[-1].wal, acks[-1].seq)


def step_write(hosted: HostedTable, step: int) -> Write:
    """Setting the table's optimizer step count, as a logged write (``OP_STEP``)."""
    hosted.entry.spec.check_trainable()
    if not 0 <= step < 2**63:
        raise InvalidArgument(f"optimizer_step must be in 0..2**63-1, got {step}")
    state = {"step": step}
    apply = functools.partial(hosted.table.load_optimizer_state, state)
    step_key = np.array([step], codec.KEY_DTYPE).tobytes()
    return Write(hosted, OP_STEP, step_key, b"", hosted.dtype, None, apply)


def erase_logged(node: Node, hosted: HostedTable, keys: np.ndarray) -> tuple[int, WriteAck]:
    """Remove rows as a logged write (``OP_ERASE``), so a replay after a crash removes
    them again instead of bringing back rows of slots the node gave away (caller holds
    the table's lock). Returns how many resident rows went, and the record to await."""
    if len(keys) == 0:
        return 0, WriteAck(0)
    erased = [0]

    def apply() -> None:
        erased[0] = hosted.table.erase(keys)

    keys_buffer = codec.encode(np.asarray(keys, codec.KEY_DTYPE))
    write = Write(hosted, OP_ERASE, keys_buffer, b"", hosted.dtype, None, apply)
    (ack,) = node.write_logged([write])
    return erased[0], ack


def wait_durable(ack: WriteAck) -> None:
    """Block until ``ack``'s record is durable (a reshard step on its own thread)."""
    if ack.wal is not None:
        ack.wal.wait_durable(ack.seq)
