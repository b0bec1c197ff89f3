"""torch.distributed.checkpoint (DCP) for models with RecStore tables, in row blocks.

A table can be far larger than a trainer's memory, so its ``weight`` never
goes to DCP as one tensor. ``state_dict(model)`` holds a ``TableWeight``
handle per table; ``RecStoreSavePlanner`` describes each table as row-block
shards of one ``[num_embeddings, embedding_dim]`` tensor (as a row-wise
sharded tensor is described) and reads each block from the table only when
the writer asks for it; ``RecStoreLoadPlanner`` reads the checkpoint block by
block and writes each block to the table as soon as it is complete. In the
checkpoint a table is an ordinary tensor entry, so a checkpoint of a
``torch.nn.EmbeddingBag`` model loads into the same model built with
``recstore.nn`` and the other way round. Everything else in the state dict
takes DCP's default road. ``save``/``load`` do it all for a model.
"""

from __future__ import annotations

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

from recstore.client.state import TableWeight, lazy_weights

CheckpointId = str | os.PathLike[str]


def state_dict(model: nn.Module) -> dict[str, Any]:
    """``model.state_dict()`` with a ``TableWeight`` handle (not a tensor) per RecStore table."""
    with lazy_weights(model):
        return model.state_dict()


class _TableSource:
    """A table as DCP's save planning sees it: row-block shards of one tensor."""

    def __init__(self, weight: TableWeight) -> None:
        self.weight = weight

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        properties = TensorProperties(dtype=self.weight.dtype)
        dim = self.weight.shape[1]
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size([start, 0])),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(
                        offsets=torch.Size([start, 0]), sizes=torch.Size([end - start, dim])
                    ),
                    properties=properties,
                    size=self.weight.shape,
                ),
            )
            for start, end in self.weight.blocks()
        ]


class RecStoreSavePlanner(DefaultSavePlanner):
    """DCP's default save planner; a ``TableWeight`` is written block by block from its table."""

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        storage_meta: StorageMeta | None = None,
        is_coordinator: bool = False,
    ) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        self.state_dict = {
            fqn: _TableSource(value) if isinstance(value, TableWeight) else value
            for fqn, value in self.state_dict.items()
        }

    def resolve_data(self, write_item: WriteItem) -> Any:
        source = self.state_dict.get(write_item.index.fqn)
        if not isinstance(source, _TableSource):
            return super().resolve_data(write_item)
        assert write_item.tensor_data is not None and write_item.tensor_data.chunk is not None
        chunk = write_item.tensor_data.chunk
        start = chunk.offsets[0]
        return source.weight.read(start, start + chunk.sizes[0])


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

    def __init__(self, weight: TableWeight, blocks: list[ChunkStorageMetadata]) -> None:
        self.weight, self._blocks = weight, blocks
        self._open: dict[int, tuple[torch.Tensor, int]] = {}  # row -> (buffer, elements to come)

    def size(self) -> torch.Size:
        return self.weight.shape

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return self._blocks

    def _block(self, start: int) -> ChunkStorageMetadata:
        return next(b for b in self._blocks if b.offsets[0] == start)

    def destination(self, read_item: ReadItem) -> torch.Tensor:
        """The part of its block's buffer that ``read_item`` fills."""
        start = read_item.dest_index.offset[0] if read_item.dest_index.offset else 0
        if start not in self._open:
            sizes = self._block(start).sizes
            self._open[start] = (torch.empty(tuple(sizes), dtype=self.weight.dtype), sizes.numel())
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
        self.weight.write(start, buffer)


_MARKER = "\x00recstore-table:"


def _marked(state: Any, tables: dict[str, TableWeight]) -> Any:
    """A copy of the containers of ``state`` with each ``TableWeight`` a marker of ``tables``."""
    if isinstance(state, TableWeight):
        marker = f"{_MARKER}{len(tables)}"
        tables[marker] = state
        return marker
    if isinstance(state, Mapping):
        return {key: _marked(value, tables) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_marked(value, tables) for value in state)
    return state


class RecStoreLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner; a ``TableWeight``'s rows go to its table block by block."""

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        metadata: Metadata | None = None,
        is_coordinator: bool = False,
    ) -> None:
        # DCP's set-up rewrites every value it does not know (None for a handle) in place:
        # it gets a copy of the state dict with markers, and the targets come in after
        tables: dict[str, TableWeight] = {}
        super().set_up_planner(_marked(state_dict, tables), metadata, is_coordinator)
        stored = metadata.state_dict_metadata if metadata is not None else {}
        targets: dict[str, Any] = {}
        for fqn, value in self.state_dict.items():
            if isinstance(value, str) and value in tables:
                weight = tables[value]
                entry = stored.get(fqn)
                blocks = (
                    _row_blocks(entry, weight.shape[1])
                    if isinstance(entry, TensorStorageMetadata) and entry.size == weight.shape
                    else []  # missing or another shape: DCP's own checks refuse it
                )
                value = _TableTarget(weight, blocks)
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


def save(model: nn.Module, checkpoint_id: CheckpointId, **options: Any) -> None:
    """``dcp.save`` of ``model``'s state; its tables are read block by block."""
    dcp.save(state_dict(model), checkpoint_id=checkpoint_id, planner=RecStoreSavePlanner(),
             **options)  # fmt: skip


def load(
    model: nn.Module, checkpoint_id: CheckpointId, *, strict: bool = True, **options: Any
) -> None:
    """``dcp.load`` into ``model`` (torch's pattern: load in place, then ``load_state_dict``)."""
    state = state_dict(model)
    dcp.load(state, checkpoint_id=checkpoint_id,
             planner=RecStoreLoadPlanner(allow_partial_load=not strict), **options)  # fmt: skip
    model.load_state_dict(state, strict=strict)
