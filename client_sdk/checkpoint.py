"""torch.distributed.checkpoint (DCP) for models with RecStore tables, in row blocks.

A table can be far larger than a trainer's memory, so its ``weight`` (and,
with ``optimizer_state=True``, its optimizer state) never goes to DCP as one
tensor. ``state_dict(model)`` holds a ``TableRows`` handle per table entry;
``RecStoreSavePlanner`` describes each entry as row-block shards of one
``[num_embeddings, width]`` tensor (as a row-wise sharded tensor is
described) and reads each block from the table only when the writer asks
for it; ``RecStoreLoadPlanner`` reads the checkpoint block by
block and writes each block to the table as soon as it is complete. In the
checkpoint a table is an ordinary tensor entry, so a checkpoint of a
``torch.nn.EmbeddingBag`` model loads into the same model built with
``recstore.nn`` and the other way round. Everything else in the state dict
takes DCP's default road. ``save``/``load`` do it all for a model.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    ReadItem,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

from recstore.client.state import TableRows, lazy_weights, optimizer_state

CheckpointId = str | os.PathLike[str]


def state_dict(model: nn.Module, *, optimizer_state: bool = False) -> dict[str, Any]:
    """``model.state_dict()`` with a ``TableRows`` handle (not a tensor) per table entry;
    ``optimizer_state``: the tables' optimizer state too (``recstore.nn.optimizer_state``)."""
    with lazy_weights(model), _optimizer_state_if(model, optimizer_state):
        return model.state_dict()


def _optimizer_state_if(model: nn.Module, wanted: bool) -> contextlib.AbstractContextManager[None]:
    return optimizer_state(model) if wanted else contextlib.nullcontext()


class _TableSource:
    """A table as DCP's save planning sees it: row-block shards of one tensor."""

    def __init__(self, rows: TableRows) -> None:
        self.rows = rows

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        properties = TensorProperties(dtype=self.rows.dtype)
        dim = self.rows.shape[1]
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size([start, 0])),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(
                        offsets=torch.Size([start, 0]), sizes=torch.Size([end - start, dim])
                    ),
                    properties=properties,
                    size=self.rows.shape,
                ),
            )
            for start, end in self.rows.blocks()
        ]


class RecStoreSavePlanner(DefaultSavePlanner):
    """DCP's default save planner; a ``TableRows`` is written block by block from its table."""

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        storage_meta: StorageMeta | None = None,
        is_coordinator: bool = False,
    ) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        self.state_dict = {
            fqn: _TableSource(value) if isinstance(value, TableRows) else value
            for fqn, value in self.state_dict.items()
        }

    def resolve_data(self, write_item: WriteItem) -> Any:
        source = self.state_dict.get(write_item.index.fqn)
        if not isinstance(source, _TableSource):
            return super().resolve_data(write_item)
        assert write_item.tensor_data is not None and write_item.tensor_data.chunk is not None
        chunk = write_item.tensor_data.chunk
        start = chunk.offsets[0]
        return source.rows.read(start, start + chunk.sizes[0])


def _row_blocks(stored: TensorStorageMetadata, dim: int) -> list[ChunkStorageMetadata]:
    """Row ranges cut where the checkpoint's own pieces start or end.

    Each stored piece is then read once (DCP's file reader loads a whole piece
    per read), and a block holds no more rows than the pieces it is made of.
    """
    cuts = sorted(
        {0, stored.size[0]}
        | {c.offsets[0] for c in stored.chunks}
        | {c.offsets[0] + c.sizes[0] for c in stored.chunks}
    )
    return [
        ChunkStorageMetadata(offsets=torch.Size([a, 0]), sizes=torch.Size([b - a, dim]))
        for a, b in itertools.pairwise(cuts)
        if b > a
    ]


class _TableTarget:
    """A table as DCP's load planning sees it: blocks that go to the table once complete."""

    def __init__(self, rows: TableRows, blocks: list[ChunkStorageMetadata]) -> None:
        self.rows, self._blocks = rows, blocks
        self._open: dict[int, tuple[torch.Tensor, int]] = {}  # row -> (buffer, elements to come)

    def size(self) -> torch.Size:
        return self.rows.shape

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return self._blocks

    def _block(self, start: int) -> ChunkStorageMetadata:
        return next(b for b in self._blocks if b.offsets[0] == start)

    def destination(self, read_item: ReadItem) -> torch.Tensor:
        """The part of its block's buffer that ``read_item`` fills."""
        start = read_item.dest_index.offset[0] if read_item.dest_index.offset else 0
        if start not in self._open:
            sizes = self._block(start).sizes
            self._open[start] = (torch.empty(tuple(sizes), dtype=self.rows.dtype), sizes.numel())
        buffer = self._open[start][0]
        for axis, (offset, length) in enumerate(
            zip(read_item.dest_offsets, read_item.lengths, strict=True)
        ):
            buffer = buffer.narrow(axis, offset, length)
        return buffer

    def filled(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        start = read_item.dest_index.offset[0] if read_item.dest_index.offset else 0
        buffer, remaining = self._open[start]
        remaining -= tensor.numel()
        if remaining:
            self._open[start] = (buffer, remaining)
            return
        del self._open[start]
        self.rows.write(start, buffer)


_MARKER = "\x00recstore-table:"


def _marked(state: Any, tables: dict[str, TableRows]) -> Any:
    """A copy of the containers of ``state`` with each ``TableRows`` a marker of ``tables``."""
    if isinstance(state, TableRows):
        marker = f"{_MARKER}{len(tables)}"
        tables[marker] = state
        return marker
    if isinstance(state, Mapping):
        return {key: _marked(value, tables) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_marked(value, tables) for value in state)
    return state


class RecStoreLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner; a ``TableRows``'s rows go to its table block by block."""

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        metadata: Metadata | None = None,
        is_coordinator: bool = False,
    ) -> None:
        # DCP's set-up rewrites every value it does not know (None for a handle) in place:
        # it gets a copy of the state dict with markers, and the targets come in after
        tables: dict[str, TableRows] = {}
        super().set_up_planner(_marked(state_dict, tables), metadata, is_coordinator)
        stored = metadata.state_dict_metadata if metadata is not None else {}
        targets: dict[str, Any] = {}
        for fqn, value in self.state_dict.items():
            if isinstance(value, str) and value in tables:
                rows = tables[value]
                entry = stored.get(fqn)
                blocks = (
                    _row_blocks(entry, rows.shape[1])
                    if isinstance(entry, TensorStorageMetadata) and entry.size == rows.shape
                    else []  # missing or another shape: DCP's own checks refuse it
                )
                value = _TableTarget(rows, blocks)
            targets[fqn] = value
        self.state_dict = targets

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        target = self.state_dict.get(read_item.dest_index.fqn)
        if isinstance(target, _TableTarget):
            return target.destination(read_item)
        return super().resolve_tensor(read_item)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        target = self.state_dict.get(read_item.dest_index.fqn)
        if isinstance(target, _TableTarget):
            target.filled(read_item, tensor)
        else:
            super().commit_tensor(read_item, tensor)


def save(
    model: nn.Module, checkpoint_id: CheckpointId, *, optimizer_state: bool = False,
    **options: Any,
) -> None:  # fmt: skip
    """``dcp.save`` of ``model``'s state; its tables are read block by block.

    ``optimizer_state``: the tables' optimizer state is saved too (also in row blocks).
    """
    state = state_dict(model, optimizer_state=optimizer_state)
    dcp.save(state, checkpoint_id=checkpoint_id, planner=RecStoreSavePlanner(), **options)


def load(
    model: nn.Module, checkpoint_id: CheckpointId, *, strict: bool = True,
    optimizer_state: bool = False, **options: Any,
) -> None:  # fmt: skip
    """``dcp.load`` into ``model`` (torch's pattern: load in place, then ``load_state_dict``).

    ``optimizer_state``: the tables' optimizer state is restored too (a checkpoint
    without it is then refused in strict mode).
    """
    state = state_dict(model, optimizer_state=optimizer_state)
    dcp.load(state, checkpoint_id=checkpoint_id,
             planner=RecStoreLoadPlanner(allow_partial_load=not strict), **options)  # fmt: skip
    with _optimizer_state_if(model, optimizer_state):
        model.load_state_dict(state, strict=strict)
