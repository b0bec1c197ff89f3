"""A collection's step as one engine call per direction (the local backend's fast path).

Table by table, an ``EmbeddingBagCollection`` step costs per table a plan, id
checks, a binding call and a sort each way: with tens of tables, more than the
engine's own work. When every bag of a collection is a sum or mean bag (any
padding, per-sample weights, empty bags; float32, float16 or bfloat16 rows)
over a host table of the local backend, its batch goes to the engine as one
``recstore._native.TableGroup`` call each way, FBGEMM TBE's calling
convention: every table's ids in one tensor, offsets over all tables' bags,
each table pooled into its columns of one [bags, sum of dims] output; backward
hands the one gradient back, and the engine merges each table's duplicate ids
and applies each table's optimizer. Per step the Python work does not grow
with the number of tables: what is per table (the tables, their columns, mean
flags, padding ids, learning rates, the offsets of fixed-size bags) is built
once and kept while the store's tables, their trainability and the client's
learning rate stay as they were.

Eagerly ``_GroupPool`` calls the engine directly; a traced graph holds
``torch.ops.recstore.emb_pool_group`` (``recstore.client.grouped_ops``).
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from recstore.client import state
from recstore.client.backends.local import LocalBackend, LocalGroup
from recstore.client.errors import BackendError
from recstore.client.shared_features import members
from recstore.client.tensors import MODULE_ID_DTYPES, check_id_range, readable_rows
from recstore.core import DType
from recstore.store.buffers import new_rows

if TYPE_CHECKING:
    from recstore.client.nn import EmbeddingBag

#: the number flattening a list of tensors into one in a single call (torch's C++)
_flatten = torch._C._nn.flatten_dense_tensors
_EMPTY_WEIGHTS = torch.empty(0, dtype=torch.float32)
_TENSOR = {torch.Tensor}
_SHAPE = operator.attrgetter("shape")


@dataclass(frozen=True)
class GroupBatch:
    """One step's bags of every table: the engine's arguments (``TableGroup.pool``)."""

    ids: torch.Tensor  # int64 [n], table by table
    offsets: torch.Tensor  # int64 [tables * bags + 1]
    bags: int
    weights: torch.Tensor  # float32 [n], or empty: no per-sample weights


@dataclass(frozen=True)
class _Current:
    """What the group's calls need, valid while ``key`` holds."""

    key: tuple[Any, ...]
    local: LocalGroup
    lrs: torch.Tensor  # float32 [tables]; 0: the table takes no update
    trains: bool
    frozen: tuple[int, ...]  # the tables that take no update: outputs without gradient


class TableGroup:
    """The bags of one collection as one native group (see the module docstring)."""

    def __init__(self, bags: list[EmbeddingBag], slots: list[int] | None = None) -> None:
        """``slots``: each feature's table (``bags`` index); a table serving several features
        gets ``copies`` (its most features) blocks of bags, one per feature, the rest empty."""
        self.bags = bags
        self.slots = list(range(len(bags))) if slots is None else slots
        self.served = members(self.slots, len(bags))
        self.copies = max(map(len, self.served))
        self.shared = self.copies > 1
        self.client = bags[0].client
        self.names = [bag.table_name for bag in bags]
        self.dims = [bag.embedding_dim for bag in bags]
        self.dtypes = [bag._dtype for bag in bags]
        self.width = sum(self.dims)
        self.starts = [sum(self.dims[:t]) for t in range(len(self.dims))]  # each one's columns
        self.mean = torch.tensor([bag.mode == "mean" for bag in bags])
        self.padding = torch.tensor([-1 if b.padding_idx is None else b.padding_idx for b in bags])
        self.ranges = [(0, bag.num_embeddings) for bag in bags]
        self.float32 = all(dtype == torch.float32 for dtype in self.dtypes)
        self.cat_dtype = self.dtypes[0] if len(set(self.dtypes)) == 1 else torch.float32
        self.handle = f"{self.client.role}/group/{uuid.uuid4().hex[:12]}"
        self._current: _Current | None = None
        self._offsets: dict[tuple[Any, ...], torch.Tensor] = {}  # fixed-size bags' offsets
        self._same_shapes: bool | None = None  # whether the last batch's features had one shape
        self._lock = threading.Lock()

    @staticmethod
    def serves(bags: list[EmbeddingBag]) -> bool:
        """Whether these bags' kind allows the group path (their tables checked later)."""
        return all(
            bag.mode in ("sum", "mean")
            and bag.max_norm is None
            and not bag.scale_grad_by_freq
            and isinstance(bag.client.ops, LocalBackend)
            for bag in bags
        )

    def current(self) -> _Current | None:
        """The native group and learning rates, rebuilt when a table, a module's
        trainability or the client's learning rate changed; None: not all host tables."""
        backend = self.client.ops
        if not isinstance(backend, LocalBackend):
            return None
        client = self.client
        key = (id(backend), backend.generation, state.trainability_changes(),
               client._learning_rate_set, client.learning_rate)  # fmt: skip
        now = self._current
        if now is not None and now.key == key:
            return now
        with self._lock:
            local = backend.table_group(self.names)
            if local is None:
                return None
            rates = []
            for bag, table in zip(self.bags, local.tables, strict=True):
                rate = client.learning_rate if client._learning_rate_set else None
                trains = bag.takes_gradients and not table.spec.inference
                rates.append((rate or table.spec.optimizer.lr) if trains else 0.0)
            lrs = torch.tensor(rates, dtype=torch.float32)
            frozen = tuple(i for i, rate in enumerate(rates) if rate <= 0)
            self._current = _Current(key, local, lrs, len(frozen) < len(rates), frozen)
            return self._current

    # -- a step's batch --------------------------------------------------------------------
    def batch(self, features: Any) -> GroupBatch | None:
        """The features as one engine batch, or None when one is of another kind (the
        collection's general path then handles it, and refuses what torch refuses)."""
        if self.shared:
            return self._shared_batch(features)
        if set(map(type, features)) == _TENSOR:  # map, attrgetter: no Python frame per table
            if self._same_shapes is not False:
                batch = self._stacked_batch(features)
                if batch is not None:
                    return batch
            return self._fixed_batch(features)
        return self._ragged_batch(features)

    def _stacked_batch(self, features: Any) -> GroupBatch | None:
        """Every feature 2-D ids of one shape (a DLRM's): one ``torch.stack`` checks that
        and lays the ids out table by table, with no Python step per table."""
        try:
            stacked = torch.stack(features)  # [tables, bags, ids per bag]
        except (RuntimeError, TypeError):  # shapes (or dtypes, devices) differ
            self._same_shapes = False
            return None
        self._same_shapes = True
        if stacked.dim() != 3 or stacked.device.type != "cpu":
            return None
        return self._fixed_batch(features, stacked)

    def _fixed_batch(self, features: Any, stacked: torch.Tensor | None = None) -> GroupBatch | None:
        """2-D ids only: bags of one size per table; the offsets kept per shapes."""
        if stacked is not None:
            shapes: tuple[Any, ...] = (len(features), stacked.shape)
        else:
            shapes = tuple(map(_SHAPE, features))
        offsets = self._offsets.get(shapes)
        if offsets is None:
            each = tuple(map(_SHAPE, features))
            if not self._plain_ids(features) or any(len(s) != 2 for s in each):
                return None
            bags = each[0][0]
            if bags == 0 or any(s[0] != bags for s in each):
                return None
            offsets = self._keep(shapes, fixed_offsets(bags, [s[1] for s in each]))
        ids = _flatten(features) if stacked is None else stacked.view(-1)
        if ids.dtype != torch.int64:
            ids = ids.to(torch.int64)
        return GroupBatch(ids, offsets, int(features[0].shape[0]), _EMPTY_WEIGHTS)

    def sized_offsets(self, bags: int, sizes: list[int]) -> torch.Tensor:
        """The offsets of ``bags`` bags per table of ``sizes[t]`` ids each (kept); shared
        tables: ``sizes`` per feature in ``ordered`` order, each table ``copies`` blocks."""
        key = (bags, tuple(sizes))
        offsets = self._offsets.get(key)
        if offsets is not None:
            return offsets
        if not self.shared:
            return self._keep(key, fixed_offsets(bags, sizes))
        per_bag, place = [], iter(sizes)
        for mine in self.served:
            for _ in mine:
                per_bag.append(torch.full((bags,), next(place), dtype=torch.int64))
            per_bag.append(torch.zeros((self.copies - len(mine)) * bags, dtype=torch.int64))
        ends = torch.cumsum(torch.cat(per_bag), 0)
        return self._keep(key, torch.cat([torch.zeros(1, dtype=torch.int64), ends]))

    def ordered(self, features: list[Any]) -> list[Any]:
        """The features table by table (a shared table's in their order)."""
        return [features[f] for mine in self.served for f in mine]

    def unfold(self, out: torch.Tensor, bags: int, joined: bool) -> Any:
        """The [copies * bags, width] output of a group with shared tables as each feature's
        output (in its table's dtype), or those side by side (``joined``)."""
        parts: list[Any] = [None] * len(self.slots)
        for mine, start, dim in zip(self.served, self.starts, self.dims, strict=True):
            for copy, feature in enumerate(mine):
                parts[feature] = out[copy * bags : (copy + 1) * bags, start : start + dim]
        if joined:
            return torch.cat(parts, 1)
        return [p.to(self.dtypes[t]) for p, t in zip(parts, self.slots, strict=True)]

    def _shared_batch(self, features: Any) -> GroupBatch | None:
        """Each table's features one after another, ``copies`` blocks of bags per table."""
        parts = []
        for table, feature in zip(self.slots, features, strict=True):
            part = _feature_bags(self.bags[table], feature)
            if part is None:
                return None
            parts.append(part)
        bags = parts[0][1].shape[0]
        if bags <= 0 or not self._plain_ids([p[0] for p in parts]):
            return None
        if any(p[1].shape[0] != bags or p[1].dtype not in MODULE_ID_DTYPES for p in parts):
            return None
        if any(int(p[1][0]) != 0 for p in parts):  # torch's rule: offsets[0] == 0
            return None
        ids, starts, weights, base = [], [], [], 0
        for mine in self.served:
            for f in mine:
                keys, offs, psw = parts[f]
                ids.append(keys)
                starts.append(offs.to(torch.int64) + base)
                weights.append(psw)
                base += keys.numel()
            starts.append(torch.full(((self.copies - len(mine)) * bags,), base))
        offsets = torch.cat([*starts, torch.tensor([base])])
        if any(w is not None for w in weights):
            psw = torch.cat([torch.ones(k.numel()) if w is None else w.reshape(-1)
                             for w, k in zip(weights, ids, strict=True)])  # fmt: skip
        else:
            psw = _EMPTY_WEIGHTS
        return GroupBatch(torch.cat(ids).to(torch.int64), offsets, self.copies * bags, psw)

    def _keep(self, key: tuple[Any, ...], offsets: torch.Tensor) -> torch.Tensor:
        if len(self._offsets) >= 8:  # a few batch shapes recur; keep only those
            self._offsets.clear()
        self._offsets[key] = offsets
        return offsets

    def _plain_ids(self, features: Any) -> bool:
        return all(
            f.dtype in MODULE_ID_DTYPES and f.device.type == "cpu" and f.dtype == features[0].dtype
            for f in features
        )

    def _ragged_batch(self, features: Any) -> GroupBatch | None:
        """(ids, offsets[, weights]) features (2-D ids too): offsets joined over the tables."""
        ids, starts, weights = [], [], []
        bags = -1
        for bag, feature in zip(self.bags, features, strict=True):
            parts = _feature_bags(bag, feature)
            if parts is None:
                return None
            keys, offs, psw = parts
            if bags not in (-1, offs.shape[0]) or offs.dtype not in MODULE_ID_DTYPES:
                return None
            bags = offs.shape[0]
            ids.append(keys)
            starts.append(offs)
            weights.append(psw)
        if bags <= 0 or not self._plain_ids(ids):
            return None
        counts = torch.tensor([k.numel() for k in ids])
        bases = torch.cumsum(counts, 0) - counts
        joined = torch.cat(starts).to(torch.int64) + bases.repeat_interleave(bags)
        if not torch.equal(joined[::bags][: len(ids)], bases):  # torch's rule: offsets[0] == 0
            return None
        offsets = torch.cat([joined, counts.sum().reshape(1)])
        if any(w is not None for w in weights):
            flat = [w.reshape(-1) if w is not None else torch.ones(k.numel())
                    for w, k in zip(weights, ids, strict=True)]  # fmt: skip
            psw = torch.cat(flat)
        else:
            psw = _EMPTY_WEIGHTS
        return GroupBatch(torch.cat(ids).to(torch.int64), offsets, bags, psw)

    # -- the engine calls ------------------------------------------------------------------
    def pool(self, batch: GroupBatch) -> torch.Tensor:
        """[bags, width] float32: each table's bags pooled into its columns."""
        now, backend = self._ready()
        # a recycled block: no fresh pages to fault in every step
        out: torch.Tensor = new_rows(batch.bags, self.width, DType.float32, True, "cpu")
        with self._ids_named(batch):
            backend.pool_group(now.local, *self._args(batch), out)
        return out

    def update(
        self, batch: GroupBatch, grad: torch.Tensor, skip: torch.Tensor | None = None
    ) -> None:
        """``pool``'s backward: each trainable table its columns of ``grad`` (not the tables
        ``skip`` flags: their outputs got no gradient)."""
        now, backend = self._ready()
        if not now.trains:
            return
        lrs = now.lrs if skip is None else now.lrs.masked_fill(skip, 0.0)
        grad = readable_rows(grad.detach().to("cpu", torch.float32))
        with self._ids_named(batch):
            backend.update_group(now.local, *self._args(batch), grad, lrs)

    def frozen(self) -> tuple[int, ...]:
        """The tables that take no update (their outputs carry no gradient)."""
        now, _ = self._ready()
        return now.frozen

    def _ready(self) -> tuple[_Current, LocalBackend]:
        now, backend = self.current(), self.client.ops
        if now is None or not isinstance(backend, LocalBackend):
            raise RuntimeError(f"the tables {self.names} are no longer host tables of one store")
        return now, backend

    def _args(self, batch: GroupBatch) -> tuple[Any, ...]:
        return batch.ids, batch.offsets, batch.bags, batch.weights, self.mean, self.padding

    @contextlib.contextmanager
    def _ids_named(self, batch: GroupBatch) -> Iterator[None]:
        """An id the engine refused, reported as a single table's check words it."""
        try:
            yield
        except BackendError:
            cuts = batch.offsets[:: batch.bags].tolist()
            for (low, high), name, a, b in zip(self.ranges, self.names, cuts, cuts[1:],
                                               strict=False):  # fmt: skip
                check_id_range(batch.ids[a:b], low, high, name)
            raise


def fixed_offsets(bags: int, sizes: list[int]) -> torch.Tensor:
    """Offsets over every table's ids of ``bags`` bags per table, ``sizes[t]`` ids a bag."""
    each = torch.tensor(sizes, dtype=torch.int64)
    bases = torch.cumsum(each * bags, 0) - each * bags
    starts = bases.repeat_interleave(bags) + torch.arange(bags).repeat(len(sizes)) * (
        each.repeat_interleave(bags)
    )
    return torch.cat([starts, (each * bags).sum().reshape(1)])


def _feature_bags(
    bag: EmbeddingBag, feature: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """One feature as 1-D ids, its bags' starts and weights; None: not the group's kind."""
    parts = _parts(feature)
    if parts is None:
        return None
    keys, offs, psw = parts
    if keys.dim() == 2:
        if offs is not None:
            return None
        offs = torch.arange(0, keys.numel(), max(1, keys.shape[1]))[: keys.shape[0]]
    elif offs is None or keys.dim() != 1 or offs.dim() != 1:
        return None
    elif bag.include_last_offset:
        offs = offs[:-1]
    if psw is not None and (bag.mode != "sum" or psw.shape != keys.shape
                            or psw.dtype != torch.float32):  # fmt: skip
        return None
    return keys.reshape(-1), offs, psw


def _parts(feature: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    if type(feature) is torch.Tensor:
        return feature, None, None
    if isinstance(feature, tuple | list) and 1 <= len(feature) <= 3:
        padded = [*feature, *itertools.repeat(None, 3 - len(feature))]
        if all(p is None or type(p) is torch.Tensor for p in padded):
            return padded[0], padded[1], padded[2]
    return None
