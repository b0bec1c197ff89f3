"""A remote collection's step with one native call per direction on the trainer.

Over gRPC a collection's step pulls each table's distinct ids once (one
MultiPull per node), pools the bags from those rows and sends each distinct
id's summed gradient. Table by table that is a hash pass, a pooling call and
a gradient call per table and direction, with Python around each: for the 26
tables of a Criteo model, more CPU than the pooling itself. Here the batch the
local group builds (``grouped.TableGroup.batch``: every table's ids in one
tensor, offsets over all tables' bags) goes through
``recstore._native.DistinctGroup``: one pass finds every table's distinct ids
(checking them against each table's range on the way), their rows come from
one multi-table pull, one call pools every table into its columns of one
output, and backward one call sums every table's distinct gradient rows into
one buffer, sent as one multi-table update. What stays per table is the
request itself: a name, a slice of the keys and a view of the rows.

Serves sum and mean bags (per-sample weights, ragged and empty bags, tables
shared by features) without padding ids, ``max_norm`` or
``scale_grad_by_freq`` over float32 tables of a remote client; anything else
takes the collection's general path. ``prefetch`` names the next batch's
pulls, which then leave with this step's gradients as they do table by table.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from recstore import _native as _native_module
from recstore.client import state
from recstore.client.grouped import GroupBatch, TableGroup
from recstore.client.shared_features import same_features
from recstore.client.tensors import check_id_range, readable_rows
from recstore.core import DType
from recstore.store.buffers import new_rows

if TYPE_CHECKING:
    from recstore.client.nn import EmbeddingBag

_native: Any = _native_module  # a compiled module: no stubs


@dataclass(frozen=True)
class _Current:
    """The native group and the tables' trainability, valid while ``key`` holds."""

    key: tuple[Any, ...]
    native: Any  # recstore._native.DistinctGroup
    ranges: list[tuple[int, int | None]]
    skip: torch.Tensor  # bool [tables]: takes no update
    frozen: tuple[int, ...]


@dataclass(frozen=True)
class _Distinct:
    """A batch's distinct ids: table t's are ``keys[t]`` (``counts[t]`` of them);
    ``inverse`` is each position's row among its table's."""

    keys: list[torch.Tensor]
    inverse: torch.Tensor
    counts: list[int]


class RemoteGroup(TableGroup):
    """The bags of one collection over a remote client (see the module docstring)."""

    def __init__(self, bags: list[EmbeddingBag], slots: list[int] | None = None) -> None:
        super().__init__(bags, slots)
        self._now: _Current | None = None
        self._last: tuple[GroupBatch, _Distinct] | None = None  # the forward's, for backward
        self._ahead: tuple[list[Any], GroupBatch] | None = None  # prefetch()'s batch

    @staticmethod
    def serves(bags: list[EmbeddingBag]) -> bool:
        """Whether these bags' kind allows the remote group path."""
        client = bags[0].client
        return (client.ops is not None and client.ops.kind != "local") and all(
            bag.mode in ("sum", "mean")
            and bag.max_norm is None
            and not bag.scale_grad_by_freq
            and bag.padding_idx is None
            and bag._dtype == torch.float32
            for bag in bags
        )

    def current(self) -> _Current | None:  # type: ignore[override]
        """The native group, rebuilt when a table was created or dropped or a module
        frozen; None: the client is not remote. A table the client no longer has is
        refused as its own calls refuse it."""
        backend = self.client.ops
        if backend is None or backend.kind == "local":
            return None
        modules = self.client._for_modules
        key = (id(backend), modules.tables_changed, state.trainability_changes())
        now = self._now
        if now is not None and now.key == key:
            return now
        with self._lock:
            ranges = modules.id_ranges(self.names)
            highs = [low if high is None else high for low, high in ranges]  # <= low: any id
            native = _native.DistinctGroup(self.dims, [low for low, _ in ranges], highs)
            skip = torch.tensor([not bag.takes_gradients for bag in self.bags])
            frozen = tuple(i for i, bag in enumerate(self.bags) if not bag.takes_gradients)
            self._now = _Current(key, native, ranges, skip, frozen)
            return self._now

    # -- a step's batch --------------------------------------------------------------------
    def batch(self, features: Any) -> GroupBatch | None:
        """As the local group's, or the batch ``prefetch`` made for these same features."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and same_features(ahead[0], features):
            return ahead[1]
        return super().batch(features)

    def prefetch(self, features: Any) -> bool:
        """Name the pulls of a forward of ``features`` (they ride on the next updates);
        False: these features take the general path."""
        batch = super().batch(features)
        if batch is None:
            return False
        distinct = self._distinct(self._ready(), batch)
        self._ahead = (list(features), batch)
        self.client._for_modules.lookahead_many(self._requests(distinct), checked=True)
        return True

    # -- the calls -------------------------------------------------------------------------
    def pool(self, batch: GroupBatch) -> torch.Tensor:
        """[bags, width] float32: each table's bags pooled into its columns."""
        now = self._ready()
        distinct = self._distinct(now, batch)
        rows = self.client._for_modules.pull_many(self._requests(distinct), checked=True)
        # a recycled block: no fresh pages to fault in every step
        out: torch.Tensor = new_rows(batch.bags, self.width, DType.float32, True, "cpu")
        now.native.pool(rows, distinct.inverse, batch.offsets, batch.bags, batch.weights,
                        self.mean, out)  # fmt: skip
        return out

    def update(
        self, batch: GroupBatch, grad: torch.Tensor, skip: torch.Tensor | None = None
    ) -> None:
        """``pool``'s backward: each trainable table's distinct rows' gradient summed from its
        columns of ``grad`` and sent (not the tables ``skip`` flags: no gradient)."""
        now = self._ready()
        skipped = now.skip if skip is None else now.skip | skip
        if bool(skipped.all()):
            return
        distinct = self._distinct(now, batch)
        grad = readable_rows(grad.detach().to("cpu", torch.float32))
        counts = distinct.counts
        sizes = [count * dim for count, dim in zip(counts, self.dims, strict=True)]
        flat = torch.empty(sum(sizes), dtype=torch.float32)
        rows = [part.view(count, dim) for part, count, dim
                in zip(flat.split(sizes), counts, self.dims, strict=True)]  # fmt: skip
        now.native.unpool(grad, distinct.inverse, batch.offsets, batch.bags, batch.weights,
                          self.mean, skipped, rows)  # fmt: skip
        flags = skipped.tolist()
        self.client._for_modules.apply_gradients([
            (name, keys, part, True)
            for name, keys, part, off in zip(self.names, distinct.keys, rows, flags, strict=True)
            if not off and keys.numel()
        ])  # fmt: skip

    def frozen(self) -> tuple[int, ...]:
        return self._ready().frozen

    def _ready(self) -> _Current:  # type: ignore[override]
        now = self.current()
        if now is None:
            raise RuntimeError(f"the tables {self.names} are no longer remote tables")
        return now

    def _distinct(self, now: _Current, batch: GroupBatch) -> _Distinct:
        """The batch's distinct ids per table: the forward's again in its backward."""
        last = self._last
        if last is not None and last[0] is batch:
            return last[1]
        n = batch.ids.numel()
        unique, inverse = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
        starts = torch.empty(len(self.names) + 1, dtype=torch.int64)
        try:
            now.native.distinct(batch.ids, batch.offsets, batch.bags, unique, inverse, starts)
        except ValueError:  # an id out of its table's range: worded as a table's own check
            cuts = batch.offsets[:: batch.bags].tolist() if batch.bags else []
            for (low, high), name, a, b in zip(now.ranges, self.names, cuts, cuts[1:],
                                               strict=False):  # fmt: skip
                check_id_range(batch.ids[a:b], low, high, name)
            raise
        bounds = starts.tolist()
        counts = [b - a for a, b in itertools.pairwise(bounds)]
        distinct = _Distinct(list(unique[: bounds[-1]].split(counts)), inverse, counts)
        self._last = (batch, distinct)
        return distinct

    def _requests(self, distinct: _Distinct) -> list[tuple[str, torch.Tensor, bool]]:
        return [(name, keys, True) for name, keys in zip(self.names, distinct.keys, strict=True)]
