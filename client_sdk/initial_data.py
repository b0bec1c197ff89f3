"""Writing a new table's initial rows, in bounded chunks.

``init_data`` documents ``init_func(shape, dtype)`` for the whole table and a
write of ids ``arange(rows) + base_offset``. For a table that fits in one
chunk that is exactly what happens; a bigger table is written chunk by chunk,
``init_func`` being called with each chunk's shape ``(chunk_rows, dim)``, so
a 10^9-row table never needs one giant tensor in the trainer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from recstore.client.backends.base import Backend
from recstore.client.specs import TableMeta
from recstore.client.tensors import as_value_tensor, torch_dtype

#: Bytes of initial rows produced and written at a time.
INIT_CHUNK_BYTES = 64 << 20

#: rows_of(start, end) -> the initial rows start..end-1 of the table, [end - start, dim].
RowSource = Callable[[int, int], torch.Tensor]


def chunk_bounds(
    rows: int, row_bytes: int, chunk_bytes: int = INIT_CHUNK_BYTES
) -> list[tuple[int, int]]:
    """[start, end) row ranges of at most ``chunk_bytes`` each (at least one row)."""
    step = max(1, chunk_bytes // max(1, row_bytes))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def write_initial_rows(
    backend: Backend,
    name: str,
    meta: TableMeta,
    rows_of: RowSource,
    chunk_bytes: int | None = None,
) -> None:
    rows, dim = meta.shape
    chunk_bytes = INIT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    dtype = torch_dtype(meta.dtype)
    for start, end in chunk_bounds(rows, meta.spec.row_bytes, chunk_bytes):
        values = rows_of(start, end)
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"init_func must return a torch.Tensor, got {type(values).__name__}")
        values = as_value_tensor(values, end - start, dim, dtype, "init_func's result")
        keys = torch.arange(start, end, dtype=torch.int64) + meta.base_offset
        backend.push(name, keys, values)
