"""Wire buffers <-> numpy arrays, checked against a table before anything is applied.

Keys and values travel as raw little-endian byte buffers (views of the request
message, see ``recstore.core.wire``). Every length, dtype and dim check lives
here as a pure function so the servicer stays thin and the checks are tested
with parameter tables. ``parse`` reads a multi-table request with the
generated classes, malformed bytes refused as InvalidArgument.
"""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from google.protobuf.message import Message

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
#: the transport rule and conversion (csrc/transport.h), shared with the native path
_native: Any = importlib.import_module("recstore._native")


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
    """Gradients are float32 (the default) or the table's own dtype; float32 tables take any."""
    grad_dtype = requested or DType.float32.value
    refusal: str = _native.transport_refusal(grad_dtype, table_dtype, True)
    if refusal:
        raise InvalidArgument(refusal)
    return grad_dtype


def value_dtype_for(requested: str, table_dtype: str) -> str:
    """Pulled rows travel in the table dtype (the default); a float32 table's in any."""
    refusal: str = _native.transport_refusal(requested, table_dtype, False)
    if refusal:
        raise InvalidArgument(refusal)
    return requested or table_dtype


def convert_rows(src: np.ndarray, src_dtype: str, dst: np.ndarray, dst_dtype: str) -> None:
    """``src`` into ``dst`` (same shape) as ``dst_dtype``: the one wire conversion (native)."""
    _native.convert_rows(np.ascontiguousarray(src), src_dtype, dst, dst_dtype)


def encode(array: np.ndarray) -> bytes:
    """Raw little-endian bytes of a (numpy) array."""
    return np.ascontiguousarray(array).tobytes()
