"""What the NVE layers share with ``recstore.nn`` modules: ``TableState``.

That is ``state_dict``, ``load_state_dict`` and DCP, freezing with
``requires_grad_`` and the refusal of a dtype conversion.

A layer's rows live in a RecStore table (``Hierarchical``, ``GPULayer``,
``LinearUVM``: ``storage`` names it) or in a block of host memory
(``HostLayer``). Either way the layer has the entry ``torch.nn.Embedding``
has, ``weight``, so ``torch.save(model.state_dict())``, ``load_state_dict``
and ``recstore.client.checkpoint`` (DCP, in row blocks) carry NVE layers as
they carry ``recstore.nn`` modules, and a checkpoint of a ``torch.nn`` model
loads into the same model built with NVE layers. The machinery is
``TableState``'s; this module only tells it where a layer's rows are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from recstore.client.client import RecStoreClient
from recstore.client.state import WEIGHT, TableRows, TableState, TableWeight


class HostRows(TableRows):
    """A ``HostLayer``'s rows (its memory block) as a ``TableRows`` handle."""

    def __init__(self, rows: torch.Tensor, name: str) -> None:
        super().__init__(None, name, tuple(rows.shape), rows.dtype)  # type: ignore[arg-type]
        self.rows = rows

    def read(self, start: int, end: int) -> torch.Tensor:
        return self.rows[start:end].clone()

    def write(self, start: int, rows: torch.Tensor) -> None:
        self.rows[start : start + len(rows)] = rows

    def same_as(self, other: object) -> bool:
        return isinstance(other, HostRows) and other.rows is self.rows


class LayerRows(TableWeight):
    """A table layer's ``weight``: rows written also leave the layer's caches, whose
    copies a training cache with a staleness bound would otherwise go on serving."""

    def __init__(
        self,
        client: RecStoreClient,
        name: str,
        shape: tuple[int, int],
        dtype: torch.dtype,
        written: Callable[[], None],
    ) -> None:
        super().__init__(client, name, shape, dtype)
        self.written = written

    def write(self, start: int, rows: torch.Tensor) -> None:
        super().write(start, rows)
        self.written()


class LayerState(TableState):
    """``TableState`` over a layer's ``storage`` (a table) or host rows."""

    storage: Any
    embedding_size: int
    data_type: torch.dtype
    name: str
    _host: torch.Tensor | None
    _cached: Any  # CachedTable | None: the host cache tier
    _tiers: Any  # DeviceCachedTable | None: the GPU cache tier

    _made_with = "the layer with data_type"

    def _rows_where(self) -> str:
        if self._host is not None:
            return f"{self.name} keeps its rows in a host memory block"
        return super()._rows_where()

    # what TableState reads, from the layer's own fields
    @property
    def client(self) -> RecStoreClient:  # type: ignore[override]
        return self.storage.client

    @property
    def table_name(self) -> str:  # type: ignore[override]
        return self.storage.name

    @property
    def embedding_dim(self) -> int:  # type: ignore[override]
        return self.embedding_size

    @property
    def _dtype(self) -> torch.dtype:  # type: ignore[override]
        return self.data_type

    @property
    def weight(self) -> torch.Tensor:
        """Every row: a ``HostLayer``'s memory block itself (loading into it in place, as
        ``dcp.load`` does, changes the layer); a table's rows read whole otherwise."""
        if self._host is not None:
            return self._host
        with torch.no_grad():
            return self.client.pull(self.table_name, torch.arange(self.num_embeddings))

    def table_weight(self) -> TableWeight:
        shape = (self.num_embeddings, self.embedding_dim)
        return LayerRows(self.client, self.table_name, shape, self._dtype, self._drop_cached_rows)

    def _drop_cached_rows(self) -> None:
        if self._cached is not None:
            self._cached.cache.clear()
        if self._tiers is not None:
            self._tiers.tier.clear()

    def table_entries(self, *, with_optimizer_state: bool) -> dict[str, TableRows]:
        if self._host is not None:  # host memory: rows only, no optimizer
            return {WEIGHT: HostRows(self._host, self.name)}
        return super().table_entries(with_optimizer_state=with_optimizer_state)

    def _has_step(self) -> bool:
        return self._host is None and super()._has_step()
