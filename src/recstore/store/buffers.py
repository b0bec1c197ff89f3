"""Outputs in the caller's flavour (numpy or torch) for the native engine to fill.

The engine's bindings take typed arrays and check them at the boundary
(dtype, rank, shape, contiguity, device, writability; see ``csrc/arrays.h``),
so nothing is checked or copied here. Large host outputs come from the
engine's recycled blocks (``csrc/row_buffers.h``): fresh memory would fault in
page by page as the gather first writes it, which costs more than the gather.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from recstore import _native as _native_module
from recstore.core import DType
from recstore.store.options import DTYPE_CODES

#: The compiled engine (no type stubs).
_native: Any = _native_module

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


def new_rows(rows: int, width: int, dtype: DType, like_torch: bool, device: str) -> Any:
    """An uninitialised [rows, width] output in the caller's flavour."""
    if device == "cpu" and rows * width * dtype.itemsize >= _native.pooled_bytes:
        return _native.new_rows(rows, width, DTYPE_CODES[dtype], like_torch)
    if like_torch:
        import torch

        return torch.empty((rows, width), dtype=torch_dtype(dtype), device=device)
    return np.empty((rows, width), dtype=NUMPY_DTYPES[dtype])
