"""Tensor conventions of the SDK, in one place.

Every public call accepts ids of any integer dtype on any device; the backends
want contiguous CPU int64 keys and values of the table's dtype. These helpers
do those conversions (and the checks that turn bad input into a clear error
before anything is sent), so the client and the torch modules agree on them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from recstore import _native as _native_module
from recstore.client.errors import IdDtypeError, IdOutOfRange
from recstore.core import DType

#: the compiled engine (no type stubs)
_native: Any = _native_module

_TORCH_OF_DTYPE = {
    DType.float32: torch.float32,
    DType.float16: torch.float16,
    DType.bfloat16: torch.bfloat16,
}
_DTYPE_OF_TORCH = {value: key for key, value in _TORCH_OF_DTYPE.items()}


def torch_dtype(dtype: DType | str) -> torch.dtype:
    return _TORCH_OF_DTYPE[DType(dtype)]


def table_dtype(dtype: Any) -> DType:
    """The table dtype for a user's ``torch.dtype`` (or dtype name); TypeError otherwise."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_OF_TORCH:
            supported = ", ".join(str(t) for t in _DTYPE_OF_TORCH)
            raise TypeError(f"unsupported embedding dtype {dtype}; use one of {supported}")
        return _DTYPE_OF_TORCH[dtype]
    try:
        return DType(str(dtype).removeprefix("torch."))
    except ValueError:
        raise TypeError(f"unsupported embedding dtype {dtype!r}") from None


def as_id_tensor(ids: Any) -> torch.Tensor:
    """Ids as a 1-D contiguous CPU int64 tensor (the documented ``ids.to(torch.int64)``)."""
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(np.ascontiguousarray(ids))
    elif not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer tensor, got {ids.dtype}")
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D tensor of shape [N], got shape {tuple(ids.shape)}")
    return ids.detach().to(device="cpu", dtype=torch.int64).contiguous()


#: the id dtypes torch.nn.Embedding / EmbeddingBag accept
MODULE_ID_DTYPES = (torch.int64, torch.int32)


def check_module_id_dtype(ids: torch.Tensor) -> None:
    """Refuse ids of a dtype torch.nn refuses, with the class torch raises."""
    if ids.dtype not in MODULE_ID_DTYPES:
        raise IdDtypeError(
            "Expected tensor for argument #1 'indices' to have one of the following scalar "
            f"types: Long, Int; but got {ids.dtype} instead"
        )


def module_keys(ids: torch.Tensor) -> torch.Tensor:
    """A module's ids (int32 or int64, any device, any shape) as CPU int64 keys, contiguous.

    Refuses what torch.nn refuses, with the class torch raises (``IdDtypeError``).
    """
    check_module_id_dtype(ids)
    return ids.detach().to(device="cpu", dtype=torch.int64).contiguous()


def result_device(ids: Any) -> torch.device:
    """Where results go back to: the caller's device (CPU for non-tensor input)."""
    return ids.device if isinstance(ids, torch.Tensor) else torch.device("cpu")


def as_value_tensor(
    values: Any, rows: int, dim: int, dtype: torch.dtype, what: str
) -> torch.Tensor:
    """Rows to write or gradients: shape [rows, dim], cast to ``dtype``, contiguous on CPU."""
    if isinstance(values, np.ndarray):
        values = torch.from_numpy(np.ascontiguousarray(values))
    elif not isinstance(values, torch.Tensor):
        values = torch.as_tensor(values)
    if not values.is_floating_point():
        raise TypeError(f"{what} must be a floating-point tensor, got {values.dtype}")
    if tuple(values.shape) != (rows, dim):
        raise ValueError(f"{what} must have shape [{rows}, {dim}], got {tuple(values.shape)}")
    return values.detach().to(device="cpu", dtype=dtype).contiguous()


def id_bounds(ids: torch.Tensor) -> tuple[int, int]:
    """The smallest and largest of non-empty ids, in one pass.

    CPU int64 ids (what ``as_id_tensor`` gives) go to the engine's pass, which
    costs a fraction of ``torch.aminmax`` on a busy machine (its OpenMP team
    waits for every thread it started, even descheduled ones).
    """
    if ids.device.type == "cpu" and ids.dtype == torch.int64:
        smallest, largest = _native.key_bounds(ids.contiguous().view(-1))
        return int(smallest), int(largest)
    bounds = torch.aminmax(ids)
    return int(bounds.min), int(bounds.max)


def check_id_range(ids: torch.Tensor, low: int, high: int | None, name: str) -> None:
    """Dense tables address rows ``low..high-1``; anything else is refused before sending."""
    if high is None or ids.numel() == 0:
        return
    smallest, largest = id_bounds(ids)
    if smallest < low or largest >= high:
        bad = smallest if smallest < low else largest
        raise IdOutOfRange(
            f"id {bad} is out of range for table {name!r}: valid ids are {low}..{high - 1}"
        )


def unique_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(keys, return_inverse=True)`` of CPU int64 keys, without the sort.

    The distinct keys come in first-occurrence order (nothing downstream needs
    them sorted); a hash pass in the engine costs a fraction of torch's sort.
    """
    flat = keys.to("cpu", torch.int64).contiguous().view(-1)
    unique = torch.empty_like(flat)
    inverse = torch.empty_like(flat)
    count = _native.unique_keys(flat, unique, inverse)
    return unique[:count], inverse.view(keys.shape)


def readable_rows(rows: torch.Tensor) -> torch.Tensor:
    """2-D rows as the engine reads them in place: columns contiguous and rows apart (a
    column slice of a wider tensor will do, with no copy); any other layout copied (a
    gradient broadcast over bags has rows 0 apart)."""
    apart = rows.shape[0] < 2 or rows.stride(0) >= rows.shape[1]
    together = rows.shape[1] < 2 or rows.stride(1) == 1
    return rows if apart and together else rows.contiguous()


def distinct_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The keys to ask for (each once) and, when some repeat, each key's place among them.

    Keys that are already distinct come back as they are (flattened) with no
    inverse: the rows pulled for them need no gather. ``spread`` undoes it.
    """
    unique, inverse = unique_keys(keys)
    if unique.numel() == keys.numel():
        return unique, None  # first-occurrence order: the keys as they came
    return unique, inverse


def spread(rows: torch.Tensor, inverse: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """Rows of the distinct keys laid out as the keys of ``shape`` were (``distinct_keys``)."""
    if inverse is None:
        return rows.view(*shape, rows.shape[-1])
    return rows[inverse]


def coalesce(ids: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique ids and their summed rows (a coalesced sparse gradient)."""
    unique, inverse = torch.unique(ids, return_inverse=True)
    if unique.numel() == ids.numel():
        order = torch.empty_like(inverse)
        order[inverse] = torch.arange(ids.numel())
        return unique, values.index_select(0, order)
    summed = torch.zeros(unique.numel(), values.shape[1], dtype=torch.float32)
    summed.index_add_(0, inverse, values.to(torch.float32))
    return unique, summed.to(values.dtype)


def last_write_wins(ids: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique ids with the row of their last occurrence (duplicate assignments in push)."""
    unique, inverse = torch.unique(ids, return_inverse=True)
    if unique.numel() == ids.numel():
        order = torch.empty_like(inverse)
        order[inverse] = torch.arange(ids.numel())
        return unique, values.index_select(0, order)
    last = torch.full((unique.numel(),), -1, dtype=torch.int64)
    last.scatter_reduce_(0, inverse, torch.arange(ids.numel()), reduce="amax")
    return unique, values.index_select(0, last)


# -- the wire's buffers (``proto/recstore/v1``): int64 keys, rows in the table dtype, bfloat16 as
# its raw uint16 bits (``recstore.core.wire.WIRE_DTYPES``) -------------------------------------
def keys_to_numpy(keys: torch.Tensor) -> np.ndarray:
    """CPU int64 keys as the little-endian array whose bytes go on the wire (no copy)."""
    return keys.numpy().astype("<i8", copy=False)


def rows_to_numpy(rows: torch.Tensor) -> np.ndarray:
    """A CPU tensor of rows as the numpy array whose bytes go on the wire (no copy)."""
    if rows.dtype == torch.bfloat16:
        return rows.view(torch.int16).numpy().view(np.uint16)
    return rows.numpy()


def rows_from_numpy(rows: np.ndarray, dtype: DType | str) -> torch.Tensor:
    """The wire array of a table of ``dtype`` as a torch tensor of that dtype (no copy)."""
    if DType(dtype) == DType.bfloat16:
        return torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(rows)
