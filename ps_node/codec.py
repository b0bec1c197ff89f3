"""Wire buffers <-> numpy arrays, checked against a table before anything is applied.

Keys and values travel as raw little-endian byte buffers (views of the request
message, see ``recstore.core.wire``). Every length, dtype and dim check lives
here as a pure function so the servicer stays thin and the checks are tested
with parameter tables.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recstore.core import DType, InvalidArgument, wire

KEY_DTYPE = np.dtype("<i8")

#: numpy storage dtype of each table dtype on the wire (bfloat16 as raw bits).
WIRE_DTYPES: dict[str, np.dtype] = wire.WIRE_DTYPES
wire_dtype = wire.wire_dtype


def decode_keys(buffer: wire.Buffer) -> npt.NDArray[np.int64]:
    """int64 keys from a raw buffer (a read-only view, copied only when misaligned)."""
    return wire.keys_view(buffer)


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
    return wire.rows_view(buffer, rows, dim, dtype, what)


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
