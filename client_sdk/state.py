"""``state_dict`` / ``load_state_dict`` of the RecStore torch modules.

torch.nn.Embedding(Bag) keep their rows in a Parameter ``weight``; a RecStore
module keeps them in its table, so ``nn.Module``'s own saving sees nothing.
``TableState`` puts the table in as ``weight``: ``state_dict()`` reads it in
row blocks into one tensor (what ``torch.save`` needs), ``load_state_dict``
writes a tensor's rows back block by block, with torch's strict-mode
semantics (missing/unexpected keys, shape mismatch -> torch's RuntimeError).
Inside ``lazy_weights(model)`` the entry is a ``TableWeight`` instead, a
handle that reads and writes row blocks on demand: what
``recstore.client.checkpoint`` hands to torch.distributed.checkpoint so a
table is never held whole in the trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from recstore.client.client import RecStoreClient
from recstore.client.initial_data import chunk_bounds

#: Bytes of rows read or written at a time by state_dict, load_state_dict and checkpoints.
STATE_CHUNK_BYTES = 16 << 20

WEIGHT = "weight"


class TableWeight:
    """A module's rows as a handle: shape and dtype, and row blocks read or written on demand."""

    def __init__(
        self, client: RecStoreClient, name: str, shape: tuple[int, int], dtype: torch.dtype
    ) -> None:
        self.client, self.table_name = client, name
        self.shape, self.dtype = torch.Size(shape), dtype

    def size(self) -> torch.Size:
        return self.shape

    def __deepcopy__(self, memo: dict[int, Any]) -> TableWeight:
        return self  # a handle: a copy would name the same table (and copy the client)

    def blocks(self) -> list[tuple[int, int]]:
        """[start, end) row ranges of at most ``STATE_CHUNK_BYTES`` each."""
        rows, dim = self.shape
        return chunk_bounds(rows, dim * self.dtype.itemsize, STATE_CHUNK_BYTES)

    def read(self, start: int, end: int) -> torch.Tensor:
        """Rows ``start..end-1`` as stored."""
        with torch.no_grad():
            return self.client.pull(self.table_name, torch.arange(start, end))

    def write(self, start: int, rows: torch.Tensor) -> None:
        """Assign rows ``start..start+len(rows)-1`` (cast to the table dtype)."""
        self.client.push(self.table_name, torch.arange(start, start + len(rows)), rows)

    def materialise(self) -> torch.Tensor:
        """The whole table as one tensor, filled block by block."""
        out = torch.empty(self.shape, dtype=self.dtype)
        for start, end in self.blocks():
            out[start:end] = self.read(start, end)
        return out

    def copy_from(self, source: torch.Tensor | TableWeight) -> None:
        """Every row from a tensor or another table's handle, block by block."""
        for start, end in self.blocks():
            rows = source.read(start, end) if isinstance(source, TableWeight) else source[start:end]
            self.write(start, rows.detach())

    def __repr__(self) -> str:
        return f"TableWeight({self.table_name!r}, shape={list(self.shape)}, dtype={self.dtype})"


class TableState(nn.Module):
    """The state_dict side of ``recstore.nn``'s modules (they derive from it)."""

    client: RecStoreClient
    table_name: str
    num_embeddings: int
    embedding_dim: int
    _dtype: torch.dtype
    _lazy_weight = False

    def table_weight(self) -> TableWeight:
        shape = (self.num_embeddings, self.embedding_dim)
        return TableWeight(self.client, self.table_name, shape, self._dtype)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        weight = self.table_weight()
        destination[prefix + WEIGHT] = weight if self._lazy_weight else weight.materialise()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """torch's rules for a Parameter ``weight``, with the rows going to the table."""
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs)  # fmt: skip
        key = prefix + WEIGHT
        if strict:
            unexpected_keys.extend(
                k for k in state_dict
                if k.startswith(prefix) and k != key and k[len(prefix):].split(".", 1)[0]
                not in self._modules
            )  # fmt: skip
        if key not in state_dict:
            missing_keys.append(key)
            return
        value = state_dict[key]
        target = self.table_weight()
        if isinstance(value, TableWeight) and value.table_name == self.table_name:
            return  # its rows are this table's rows already (a checkpoint loaded in place)
        if not isinstance(value, torch.Tensor | TableWeight):
            error_msgs.append(
                f'While copying the parameter named "{key}", expected torch.Tensor or '
                f"Tensor-like object from checkpoint but received {type(value)}"
            )
            return
        if tuple(value.shape) != tuple(target.shape):
            error_msgs.append(
                f"size mismatch for {key}: copying a param with shape {value.shape} from "
                f"checkpoint, the shape in current model is {target.shape}."
            )
            return
        target.copy_from(value)


def _table_modules(model: nn.Module) -> Iterator[TableState]:
    for module in model.modules():
        if isinstance(module, TableState):
            yield module


@contextlib.contextmanager
def lazy_weights(model: nn.Module) -> Iterator[None]:
    """Within: ``model.state_dict()`` holds a ``TableWeight`` for each RecStore table."""
    modules = list(_table_modules(model))
    for module in modules:
        module._lazy_weight = True
    try:
        yield
    finally:
        for module in modules:
            module._lazy_weight = False
