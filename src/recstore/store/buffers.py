"""Check caller buffers (numpy arrays, torch tensors) and hand out raw addresses.

The native engine works on raw pointers; everything that could make a pointer
wrong (dtype, rank, shape, contiguity, device, writability) is checked here,
before the engine is called, so bad input raises a clear TypeError or
InvalidArgument and the table stays untouched. Nothing is copied unless the
caller's buffer is on another device than the table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from recstore.core import DType, InvalidArgument

#: numpy dtype that carries each table dtype (bfloat16 as raw uint16 bits).
NUMPY_DTYPES: dict[DType, np.dtype[Any]] = {
    DType.float32: np.dtype(np.float32),
    DType.float16: np.dtype(np.float16),
    DType.bfloat16: np.dtype(np.uint16),
}


def is_torch(x: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def torch_dtype(dtype: DType) -> Any:
    import torch

    return {
        DType.float32: torch.float32,
        DType.float16: torch.float16,
        DType.bfloat16: torch.bfloat16,
    }[dtype]


@dataclass
class Buffer:
    """A checked buffer: its address, row count and the object keeping it alive."""

    address: int
    rows: int
    obj: Any
    is_torch: bool


def _describe(x: object) -> str:
    if is_torch(x) or isinstance(x, np.ndarray):
        return f"{type(x).__name__} of dtype {x.dtype} and shape {tuple(x.shape)}"  # type: ignore[attr-defined]
    return type(x).__name__


def _check_device(x: Any, device: str, what: str) -> None:
    if x.device.type != device.split(":")[0]:
        raise InvalidArgument(f"{what} is on {x.device}, the table is on {device}")


def keys_buffer(keys: object, device: str = "cpu") -> Buffer:
    """A 1-D contiguous int64 key array."""
    if isinstance(keys, np.ndarray):
        if keys.dtype != np.int64:
            raise TypeError(f"keys must be int64, got {_describe(keys)}")
        if keys.ndim != 1:
            raise InvalidArgument(f"keys must be 1-D, got shape {keys.shape}")
        if not keys.flags.c_contiguous:
            raise TypeError("keys must be a contiguous array")
        return Buffer(keys.ctypes.data, keys.shape[0], keys, False)
    if is_torch(keys):
        import torch

        assert isinstance(keys, torch.Tensor)
        if keys.dtype != torch.int64:
            raise TypeError(f"keys must be int64, got {_describe(keys)}")
        if keys.dim() != 1:
            raise InvalidArgument(f"keys must be 1-D, got shape {tuple(keys.shape)}")
        if not keys.is_contiguous():
            raise TypeError("keys must be a contiguous tensor")
        _check_device(keys, device, "keys")
        return Buffer(keys.data_ptr(), keys.shape[0], keys, True)
    raise TypeError(f"keys must be a numpy array or torch tensor of int64, got {_describe(keys)}")


def rows_buffer(
    values: object,
    rows: int,
    width: int,
    dtypes: tuple[DType, ...],
    what: str,
    device: str = "cpu",
    writable: bool = False,
) -> tuple[Buffer, DType]:
    """A contiguous [rows, width] matrix in one of ``dtypes``; returns it and its dtype."""
    if isinstance(values, np.ndarray):
        by_numpy = {NUMPY_DTYPES[d]: d for d in reversed(dtypes)}
        dtype = by_numpy.get(values.dtype)
        if dtype is None:
            names = ", ".join(str(NUMPY_DTYPES[d]) for d in dtypes)
            raise TypeError(f"{what} must be {names}, got {_describe(values)}")
        shape: tuple[int, ...] = values.shape
        if not values.flags.c_contiguous:
            raise TypeError(f"{what} must be a contiguous array")
        if writable and not values.flags.writeable:
            raise TypeError(f"{what} must be writable")
        address, is_t = values.ctypes.data, False
    elif is_torch(values):
        import torch

        assert isinstance(values, torch.Tensor)
        by_torch = {torch_dtype(d): d for d in reversed(dtypes)}
        found = by_torch.get(values.dtype)
        if found is None:
            names = ", ".join(str(torch_dtype(d)) for d in dtypes)
            raise TypeError(f"{what} must be {names}, got {_describe(values)}")
        dtype = found
        shape = tuple(values.shape)
        if not values.is_contiguous():
            raise TypeError(f"{what} must be a contiguous tensor")
        _check_device(values, device, what)
        address, is_t = values.data_ptr(), True
    else:
        raise TypeError(f"{what} must be a numpy array or torch tensor, got {_describe(values)}")
    if shape != (rows, width):
        raise InvalidArgument(f"{what} must have shape ({rows}, {width}), got {shape}")
    return Buffer(address, rows, values, is_t), dtype


def new_rows(rows: int, width: int, dtype: DType, like_torch: bool, device: str) -> Any:
    """An uninitialised [rows, width] output in the caller's flavour."""
    if like_torch:
        import torch

        return torch.empty((rows, width), dtype=torch_dtype(dtype), device=device)
    return np.empty((rows, width), dtype=NUMPY_DTYPES[dtype])
