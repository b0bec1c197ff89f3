"""What a layer's ``storage`` argument may be: a RecStore table, or a block of host memory.

``RemoteTable(client, name)`` is the parameter server the reference's
``Hierarchical`` layer expects a user to bring: a RecStore table reached
through a ``RecStoreClient`` (local or gRPC backend). ``HostMemBlock`` is the
reference's host-memory block for a ``HostLayer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

import torch

from recstore.client import op_tables
from recstore.client.client import RecStoreClient
from recstore.client.nn import TORCH_INITIALIZER, _mode_metadata


class DataType_t(Enum):
    """Row dtypes of the reference's memory blocks."""

    Float32 = torch.float32
    Float16 = torch.float16
    BFloat16 = torch.bfloat16


class HostMemBlock:
    """``num_embeddings`` rows of ``row_size`` values in host memory (pinned when a GPU
    is present, so a copy to it does not stage), zero-initialised."""

    def __init__(
        self, row_size: int, num_embeddings: int, dtype: DataType_t = DataType_t.Float32
    ) -> None:
        if row_size < 1 or num_embeddings < 1:
            raise ValueError(
                f"row_size and num_embeddings must be >= 1, got {row_size}, {num_embeddings}"
            )
        if not isinstance(dtype, DataType_t):
            raise TypeError(f"dtype must be a DataType_t, got {dtype!r}")
        pin = torch.cuda.is_available()
        self.row_size, self.num_embeddings, self.dtype = row_size, num_embeddings, dtype.value
        self.tensor = torch.zeros((num_embeddings, row_size), dtype=dtype.value, pin_memory=pin)


def host_rows(
    storage: Any, shape: tuple[int, int], dtype: torch.dtype, weight_init: torch.Tensor | None
) -> torch.Tensor:
    """A HostLayer's rows: its memory block's, else a new block (``weight_init`` copied in)."""
    if storage is None:
        storage = HostMemBlock(shape[1], shape[0], block_dtype(dtype))
    if not isinstance(storage, HostMemBlock):
        raise TypeError(
            "LayerType.HostLayer storage must be host memory (recstore.nve.HostMemBlock), "
            f"got {type(storage).__name__}"
        )
    if (storage.num_embeddings, storage.row_size) != shape or storage.dtype != dtype:
        raise ValueError(
            f"the memory block holds {storage.num_embeddings} x {storage.row_size} "
            f"{storage.dtype}, the layer is {shape[0]} x {shape[1]} {dtype}"
        )
    if weight_init is not None:
        storage.tensor.copy_(weight_init)
    return storage.tensor


def block_dtype(dtype: torch.dtype) -> Any:
    for member in DataType_t:
        if member.value == dtype:
            return member
    raise TypeError(f"data_type must be float32, float16 or bfloat16, got {dtype}")


class RemoteTable:
    """A RecStore table as a layer's storage: ``client``'s table ``name``.

    The layer creates the table when it does not exist (rows from
    ``weight_init``, else drawn by the server from ``initializer``, default N(0, 1))
    and otherwise checks that its shape and dtype are the layer's. ``optimizer``:
    the table's server-side optimizer when the layer creates it (default: the
    client's SGD).
    """

    def __init__(
        self,
        client: RecStoreClient,
        name: str,
        *,
        optimizer: Any = None,
        initializer: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(client, RecStoreClient):
            raise TypeError(f"RemoteTable needs a RecStoreClient, got {type(client).__name__}")
        if not name:
            raise ValueError("RemoteTable needs a table name")
        self.client, self.name, self.optimizer = client, name, optimizer
        self.initializer = (
            initializer if initializer is not None else {**TORCH_INITIALIZER, "seed": 0}
        )

    def bind(
        self,
        num_embeddings: int,
        embedding_size: int,
        dtype: torch.dtype,
        weight_init: torch.Tensor | None,
        optimize_for_training: bool,
        placement: Mapping[str, Any] | None = None,
    ) -> str:
        """Create or find the table (``placement``: spec fields of its storage tier); the
        op handle ``recstore.nn``'s ops know it by."""
        from recstore.core import Optimizer

        weight = None if weight_init is None else weight_init.detach().to("cpu", dtype)
        self.client._for_modules.create(
            self.name,
            (num_embeddings, embedding_size),
            dtype,
            (lambda start, end: weight[start:end]) if weight is not None else None,
            metadata={
                "initializer": self.initializer,
                **_mode_metadata(optimize_for_training),
                **(placement or {}),
            },
            optimizer=self.optimizer
            if self.optimizer is not None
            else Optimizer(lr=self.client.learning_rate),
        )
        return op_tables.register(self.client, self.name)

    def __repr__(self) -> str:
        return f"RemoteTable({self.client.backend!r}, {self.name!r})"
