"""Wire buffers <-> numpy arrays, checked against a table before anything is applied.

Keys and values travel as raw little-endian byte buffers (views of the request
message, see ``recstore.core.wire``). Every length, dtype and dim check lives
here as a pure function so the servicer stays thin and the checks are tested
with parameter tables. The multi-table calls' replies are framed here too,
byte for byte as ``recstore.core.wire`` frames them but in one pass, at a
fraction of its per-field cost; ``parse`` reads a request with the generated
classes, malformed bytes refused as InvalidArgument.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError, Message

from recstore.core import DType, InvalidArgument, wire

KEY_DTYPE = np.dtype("<i8")

#: numpy storage dtype of each table dtype on the wire (bfloat16 as raw bits).
WIRE_DTYPES: dict[str, np.dtype] = wire.WIRE_DTYPES
wire_dtype = wire.wire_dtype

# numpy's cheap ``aligned`` flag means "address a multiple of the itemsize" (what
# the engine needs) only where each dtype's alignment is its size: everywhere
# this runs, but otherwise every buffer takes the general path.
_ALIGNMENT_IS_SIZE = all(d.alignment == d.itemsize for d in (KEY_DTYPE, *WIRE_DTYPES.values()))
M = TypeVar("M", bound=Message)


def decode_keys(buffer: wire.Buffer) -> npt.NDArray[np.int64]:
    """int64 keys from a raw buffer (a read-only view, copied only when misaligned)."""
    if _ALIGNMENT_IS_SIZE and not len(buffer) % 8:
        keys = np.frombuffer(buffer, KEY_DTYPE)
        if keys.flags.aligned:
            return keys
    return wire.keys_view(buffer)  # copies, or refuses with its message


def check_declared(declared_dtype: str, declared_dim: int, dtype: str, dim: int) -> None:
    """Optional dtype/dim a request declares must match the table's."""
    if declared_dtype and declared_dtype != dtype:
        raise InvalidArgument(f"dtype {declared_dtype!r} does not match the table dtype {dtype!r}")
    if declared_dim and declared_dim != dim:
        raise InvalidArgument(f"dim {declared_dim} does not match the table dim {dim}")


def decode_rows(
    buffer: wire.Buffer, rows: int, dim: int, dtype: str, what: str = "values"
) -> np.ndarray:
    """A [rows, dim] array of ``dtype`` over a raw buffer whose length must match exactly."""
    storage = WIRE_DTYPES.get(dtype)
    if _ALIGNMENT_IS_SIZE and storage is not None and len(buffer) == rows * dim * storage.itemsize:
        values = np.frombuffer(buffer, storage).reshape(rows, dim)
        if values.flags.aligned:
            return values
    return wire.rows_view(buffer, rows, dim, dtype, what)  # copies, or refuses with its message


def grad_dtype_for(requested: str, table_dtype: str) -> str:
    """Gradients are float32 (the default) or the table's own dtype."""
    grad_dtype = requested or DType.float32.value
    if grad_dtype not in (DType.float32.value, table_dtype):
        raise InvalidArgument(
            f"grad_dtype {grad_dtype!r} must be float32 or the table dtype {table_dtype!r}"
        )
    return grad_dtype


def encode(array: np.ndarray) -> bytes:
    """Raw little-endian bytes of a (numpy) array."""
    return np.ascontiguousarray(array).tobytes()


# -- multi-table messages ------------------------------------------------------------
def parse(message_type: type[M], data: bytes) -> M:
    """A request as the generated class ``message_type``; malformed bytes are InvalidArgument."""
    try:
        return message_type.FromString(data)
    except DecodeError as error:
        name = message_type.DESCRIPTOR.name
        raise InvalidArgument(f"malformed {name}: {error}") from None


def _length5(size: int) -> bytes:
    """An embedded message's length as ``wire`` writes it: a varint padded to 5 bytes."""
    if size >> 35:
        return wire.encode_varint(size, wire.EMBEDDED_LENGTH_WIDTH)
    return bytes(
        (
            size & 0x7F | 0x80,
            size >> 7 & 0x7F | 0x80,
            size >> 14 & 0x7F | 0x80,
            size >> 21 & 0x7F | 0x80,
            size >> 28,
        )
    )


def _rows_message(tag: bytes, rows: int) -> bytes:
    """An embedded UpdateResponse (field ``tag``) of ``rows`` rows."""
    inner = b"\x08" + wire.encode_varint(rows) if rows else b""
    return tag + _length5(len(inner)) + inner


def encode_multi_rows_response(rows: Iterable[int]) -> bytes:
    """MultiUpdateResponse: the bytes of ``wire.encode_multi_rows_response(rows)``."""
    return b"".join([_rows_message(b"\x0a", count) for count in rows])


#: PullResponse.dtype (field 3) of each wire dtype, written whole
_DTYPE_FIELDS = {
    name: b"\x1a" + wire.encode_varint(len(name)) + name.encode() for name in WIRE_DTYPES
}


@functools.lru_cache(maxsize=1024)
def _dim_field(dim: int, width: int) -> bytes:
    """PullResponse.dim (field 2), its varint padded to ``width`` bytes."""
    return b"\x10" + wire.encode_varint(dim, width)


def multi_pull_response_frame(
    shapes: Sequence[wire.PullShape], carried_rows: Sequence[int] = ()
) -> tuple[bytes, list[tuple[np.ndarray, np.ndarray | None]]]:
    """``wire.multi_pull_response_frame(shapes, carried_rows=carried_rows)``, in one pass.

    The same message (every rows payload starts 8-byte aligned) and the same
    (values [rows, dim], found or None) per shape, to fill in place before
    ``wire.finish(message)``.
    """
    storages = [WIRE_DTYPES.get(dtype) or wire_dtype(dtype) for _, _, dtype, _ in shapes]
    carried = b"".join([_rows_message(b"\x12", count) for count in carried_rows])
    placed = [(0, carried)] if carried else []  # (position, bytes) of all but the holes
    holes: list[int] = []  # the position of each shape's found (read-only) and values
    position = len(carried)
    for (rows, dim, dtype, read_only), storage in zip(shapes, storages, strict=True):
        size = rows * dim * storage.itemsize
        found_head = b"\x22" + wire.encode_varint(rows) if read_only else b""
        values_head = b"\x0a" + wire.encode_varint(size)
        before_pad = len(_DTYPE_FIELDS[dtype]) + len(found_head) + (rows if read_only else 0)
        # dim's varint is widened so that the values start aligned (wire's payload pad)
        start = position + 1 + wire.EMBEDDED_LENGTH_WIDTH + before_pad + 1 + len(values_head)
        minimal = wire.varint_size(dim)
        width = minimal + -(start + minimal) % wire.ALIGN
        pad = _dim_field(dim, width if width <= wire.MAX_VARINT_BYTES else minimal) + values_head
        opening = b"\x0a" + _length5(before_pad + len(pad) + size) + _DTYPE_FIELDS[dtype]
        if read_only:
            placed.append((position, opening + found_head))
            position += len(opening) + len(found_head)
            holes.append(position)
            position += rows
            placed.append((position, pad))
        else:
            placed.append((position, opening + pad))
            position += len(opening)
        position += len(pad)
        holes.append(position)
        position += size
    message, view = wire.writable_bytes(position)
    for at, data in placed:
        view[at : at + len(data)] = data
    out: list[tuple[np.ndarray, np.ndarray | None]] = []
    hole = iter(holes)
    for (rows, dim, _, read_only), storage in zip(shapes, storages, strict=True):
        found_out = None
        if read_only:
            at = next(hole)
            found_out = np.frombuffer(view[at : at + rows], np.bool_)
        at = next(hole)
        values_out = np.frombuffer(view[at : at + rows * dim * storage.itemsize], storage)
        out.append((values_out.reshape(rows, dim), found_out))
    return message, out
