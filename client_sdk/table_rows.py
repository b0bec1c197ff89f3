"""Handles on a table's per-row data: its rows (``weight``) and its optimizer state.

A RecStore table can be far larger than a trainer's memory, so what a module's
``state_dict`` holds for it may be a handle rather than a tensor: shape and
dtype, and row blocks read or written on demand (of at most
``STATE_CHUNK_BYTES``). ``TableWeight`` is the table's rows; ``TableOptimizerState``
is one field of the rows' optimizer state (adagrad's ``sum``, adam's ``exp_avg``
and ``exp_avg_sq``, ``TableSpec.optimizer.state_fields``), read and written with
the rows' other state through ``export_rows``/``import_rows``.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from recstore.client.backends.base import RowChunk
from recstore.client.client import RecStoreClient
from recstore.client.initial_data import chunk_bounds

#: Bytes of rows read or written at a time by state_dict, load_state_dict and checkpoints.
STATE_CHUNK_BYTES = 16 << 20


class TableRows(abc.ABC):
    """Per-row data of a table as a tensor-like handle, moved in row blocks."""

    def __init__(
        self, client: RecStoreClient, name: str, shape: tuple[int, int], dtype: torch.dtype
    ) -> None:
        self.client, self.table_name = client, name
        self.shape, self.dtype = torch.Size(shape), dtype

    def size(self) -> torch.Size:
        return self.shape

    def __deepcopy__(self, memo: dict[int, Any]) -> TableRows:
        return self  # a handle: a copy would name the same table (and copy the client)

    def blocks(self) -> list[tuple[int, int]]:
        """[start, end) row ranges of at most ``STATE_CHUNK_BYTES`` each."""
        rows, width = self.shape
        return chunk_bounds(rows, width * self.dtype.itemsize, STATE_CHUNK_BYTES)

    @abc.abstractmethod
    def read(self, start: int, end: int) -> torch.Tensor:
        """Rows ``start..end-1``."""

    @abc.abstractmethod
    def write(self, start: int, rows: torch.Tensor) -> None:
        """Write rows from ``start`` on."""

    def same_as(self, other: object) -> bool:
        """Whether ``other`` is a handle on this very data (nothing to copy)."""
        return type(other) is type(self) and vars(other) == vars(self)

    def materialise(self) -> torch.Tensor:
        """All rows as one tensor, filled block by block."""
        out = torch.empty(self.shape, dtype=self.dtype)
        for start, end in self.blocks():
            out[start:end] = self.read(start, end)
        return out

    def copy_from(self, source: torch.Tensor | TableRows) -> None:
        """Every row from a tensor or another handle, block by block."""
        for start, end in self.blocks():
            rows = source.read(start, end) if isinstance(source, TableRows) else source[start:end]
            self.write(start, rows.detach())

    def __repr__(self) -> str:
        shape = list(self.shape)
        return f"{type(self).__name__}({self.table_name!r}, shape={shape}, dtype={self.dtype})"


class TableWeight(TableRows):
    """A module's rows: ``weight``."""

    def read(self, start: int, end: int) -> torch.Tensor:
        """Rows ``start..end-1`` as stored."""
        with torch.no_grad():
            return self.client.pull(self.table_name, torch.arange(start, end))

    def write(self, start: int, rows: torch.Tensor) -> None:
        """Assign rows ``start..start+len(rows)-1`` (cast to the table dtype)."""
        self.client.push(self.table_name, torch.arange(start, start + len(rows)), rows)


class TableOptimizerState(TableRows):
    """One field of the rows' optimizer state: float32 [rows, width], columns
    ``offset..offset+width-1`` of each row's state (``total`` values)."""

    def __init__(
        self, client: RecStoreClient, name: str, rows: int, offset: int, width: int, total: int
    ) -> None:
        super().__init__(client, name, (rows, width), torch.float32)
        self.offset, self.total = offset, total

    def _state(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, whole optimizer state) of rows ``ids`` (contiguous, ascending)."""
        with torch.no_grad():
            values = self.client.pull(self.table_name, ids)  # a row is stored once pulled
        state = torch.zeros(len(ids), self.total)
        for chunk in self.client.export_rows(self.table_name, with_state=True, ids=ids):
            assert chunk.state is not None
            state[chunk.keys - ids[0]] = chunk.state
        return values, state

    def read(self, start: int, end: int) -> torch.Tensor:
        _, state = self._state(torch.arange(start, end))
        return state[:, self.offset : self.offset + self.shape[1]].clone()

    def write(self, start: int, rows: torch.Tensor) -> None:
        """Replace this field of rows ``start..``; their values and other fields stay."""
        ids = torch.arange(start, start + len(rows))
        values, state = self._state(ids)
        state[:, self.offset : self.offset + self.shape[1]] = rows.to(torch.float32)
        self.client.import_rows(self.table_name, [RowChunk(ids, values, state)])
