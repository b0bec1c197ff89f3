"""Tensors <-> the PS wire format, and gRPC failures -> the SDK's errors.

Keys and rows travel as raw little-endian buffers (``proto/recstore/v1``):
int64 keys, rows in the table dtype with bfloat16 as its raw uint16 bits.
Pure functions, so the conversions and the error mapping are tested without
a server.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from recstore.client.errors import BackendError, TableNotInitialized
from recstore.core import DType, WrongShard

EPOCH_METADATA_KEY = "x-recstore-epoch"

_WIRE_DTYPE: dict[DType, np.dtype] = {
    DType.float32: np.dtype("<f4"),
    DType.float16: np.dtype("<f2"),
    DType.bfloat16: np.dtype("<u2"),
}


def wire_dtype(dtype: DType | str) -> np.dtype:
    return _WIRE_DTYPE[DType(dtype)]


def keys_to_numpy(keys: torch.Tensor) -> npt.NDArray[np.int64]:
    return keys.numpy().astype("<i8", copy=False)


def rows_to_numpy(rows: torch.Tensor) -> np.ndarray:
    """A CPU tensor of rows as the numpy array whose bytes go on the wire."""
    if rows.dtype == torch.bfloat16:
        return rows.view(torch.int16).numpy().view(np.uint16)
    return rows.numpy()


def rows_from_numpy(rows: np.ndarray, dtype: DType | str) -> torch.Tensor:
    """The wire array of a table of ``dtype`` as a torch tensor of that dtype (no copy)."""
    if DType(dtype) == DType.bfloat16:
        return torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(rows)


def decode_rows(buffer: bytes, rows: int, dim: int, dtype: DType | str) -> np.ndarray:
    """A [rows, dim] read-only view of a reply buffer; BackendError if its size is wrong."""
    storage = wire_dtype(dtype)
    if len(buffer) != rows * dim * storage.itemsize:
        raise BackendError(
            f"PS node answered {len(buffer)} bytes for {rows} rows of dim {dim} "
            f"({DType(dtype).value})",
            code="DATA_LOSS",
        )
    return np.frombuffer(buffer, dtype=storage).reshape(rows, dim)


def node_epoch(trailing_metadata: object) -> int | None:
    """The node's slot-map epoch from trailing metadata, None when absent."""
    for key, value in trailing_metadata or ():  # type: ignore[attr-defined]
        if key == EPOCH_METADATA_KEY:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def map_rpc_error(
    code_name: str,
    details: str,
    trailing_metadata: object,
    *,
    method: str,
    table: str,
    endpoint: str,
) -> Exception:
    """One gRPC failure as the exception the SDK raises (or WrongShard for the router)."""
    where = f"{method} on table {table!r} at PS node {endpoint}"
    if code_name == "NOT_FOUND":
        return TableNotInitialized(f"{where}: table not found ({details})", reason=details)
    if code_name == "FAILED_PRECONDITION":
        epoch = node_epoch(trailing_metadata)
        if epoch is not None:
            return WrongShard(f"{where}: {details}", epoch)
    return BackendError(f"{where} failed: {code_name}: {details}", code=code_name, reason=details)
