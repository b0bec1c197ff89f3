"""``EmbeddingBagCollection``: several RecStore embedding bags looked up together.

A model with many sparse features (DLRM, two-tower, ...) looks up one bag per
feature on every step. Done bag by bag over gRPC that is one Pull and one
Update per table and shard; a collection pulls the rows of every bag with one
MultiPull per PS node and sends every bag's gradients with one MultiUpdate per
node (left in flight like a single bag's update, with read-your-writes kept
per table). Each bag still computes exactly what it computes alone — it plans
its lookup, the collection fetches the rows, the bag finishes the pooling —
so results are those of the bags used one by one. In the spirit of torchrec's
class of the same name, not its API: a list of bags (or their configs) in, a
list of (ids, offsets) per feature in, a list of pooled outputs out (or, with
``concat``, one [batch, sum of dims] output the engine pools every table into).
On the local backend a collection of sum/mean bags over host tables skips the
per-bag planning: its step is one engine call each way for all its tables
(``recstore.client.grouped``), eagerly and in a compiled graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from recstore.client import dispatch
from recstore.client.client import RecStoreClient
from recstore.client.grouped import TableGroup
from recstore.client.grouped_ops import pool_group, traced_pool_group
from recstore.client.grouped_ops import register as register_group
from recstore.client.lookup import NO_PADDING
from recstore.client.nn import EmbeddingBag, Lookup
from recstore.client.pooled import pools_in_engine
from recstore.client.remote_group import RemoteGroup
from recstore.client.shared_features import (
    Feature,
    feature_args,
    fold,
    members,
    same_features,
    split,
)


@dataclass(frozen=True)
class EmbeddingBagConfig:
    """The arguments of one ``EmbeddingBag`` of a collection (the rest take their defaults)."""

    num_embeddings: int
    embedding_dim: int
    name: str | None = None
    mode: str = "mean"
    optimizer: Any = None
    seed: int | None = None
    initializer: dict[str, Any] | None = None
    padding_idx: int | None = None
    include_last_offset: bool = False
    dtype: torch.dtype | None = None
    #: False: the bag's table is an inference table (no optimizer state, updates refused)
    optimize_for_training: bool = True

    def build(self, client: RecStoreClient | None = None) -> EmbeddingBag:
        return EmbeddingBag(
            self.num_embeddings, self.embedding_dim, mode=self.mode,
            include_last_offset=self.include_last_offset, padding_idx=self.padding_idx,
            dtype=self.dtype, name=self.name, client=client, optimizer=self.optimizer,
            seed=self.seed, initializer=self.initializer,
            optimize_for_training=self.optimize_for_training,
        )  # fmt: skip


class EmbeddingBagCollection(nn.Module):
    """Several ``recstore.nn.EmbeddingBag`` modules with one request per PS node and step."""

    def __init__(
        self,
        tables: Sequence[EmbeddingBag | EmbeddingBagConfig],
        *,
        client: RecStoreClient | None = None,
        grouped: bool = True,
    ) -> None:
        """``grouped=False``: table by table even where one engine call per direction
        would serve every table (``recstore.client.grouped``)."""
        super().__init__()
        if not tables:
            raise ValueError("an EmbeddingBagCollection needs at least one bag")
        bags, self._slots = _tables(tables, client)
        if len({id(bag.client) for bag in bags}) != 1:
            raise ValueError("every bag of a collection must use the same RecStoreClient")
        # a table serving several features: their inputs are joined (shared_features)
        self._served = members(self._slots, len(bags))
        self._shared = len(self._slots) != len(bags)
        self.bags = nn.ModuleList(bags)
        self.client: RecStoreClient = bags[0].client
        # every table's bags in one engine call each way, where the bags and tables allow
        self._group = _group_of(bags, self._slots) if grouped else None
        self._grouped = self._group is not None and self._group.current() is not None
        if self._group is not None:
            register_group(self._group)  # the name its traced ops call it by
        # The autograd anchor: not a Parameter, so dense torch optimizers never see it.
        self._anchor = torch.empty(0, requires_grad=True)
        self._ahead: tuple[list[Feature], list[Lookup]] | None = None  # prefetch()'s plans

    def requires_grad_(self, requires_grad: bool = True) -> Any:
        """Freezes (False) or unfreezes every bag's table, all or none of them
        (``EmbeddingBag.requires_grad_``)."""
        bags: list[EmbeddingBag] = list(self.bags)  # type: ignore[arg-type]
        for bag in bags:
            bag._check_requires_grad(requires_grad)
        for bag in bags:
            bag.requires_grad_(requires_grad)
        return super().requires_grad_(requires_grad)

    @property
    def table_names(self) -> list[str]:
        return [str(bag.table_name) for bag in self.bags]

    def prefetch(self, features: Sequence[Feature]) -> None:
        """Start fetching the rows the next ``forward(features)`` will need.

        Call it with the next batch before this step's ``loss.backward()`` (or
        after it): over gRPC the next batch's pulls then leave with this step's
        gradients, and the round trip overlaps the rest of the step. The next
        forward with equal features uses those rows; results are exactly those
        of not prefetching (anything else done with the client in between makes
        them stale and the forward pulls afresh). With the local backend, or
        bags that renormalise rows (``max_norm``), it only plans ahead.
        """
        self._check_count(features)
        if self._grouped:
            if not isinstance(self._group, RemoteGroup):
                return  # one local engine call: no round trip to hide, nothing to plan ahead
            if self._group.prefetch(features):  # else: features of the general path
                self._ahead = None
                return
        bags: list[EmbeddingBag] = list(self.bags)  # type: ignore[arg-type]
        if any(bag.max_norm is not None for bag in bags):
            self._ahead = None  # planning renormalises (writes) rows: not ahead of backward
            return
        inputs, _ = fold(bags, self._served, features)
        plans = [self._plan(bag, feature) for bag, feature in zip(bags, inputs, strict=True)]
        self._ahead = (list(features), plans)
        modules = self.client._for_modules
        requests = []
        for bag, plan in zip(bags, plans, strict=True):  # what the lookup op will pull
            keys, unique, _ = modules.wire_keys(plan.ids.to("cpu", torch.int64))
            requests.append((bag.table_name, keys, unique))
        modules.lookahead_many(requests)

    @staticmethod
    def _plan(bag: EmbeddingBag, feature: Feature) -> Lookup:
        return bag._plan(*feature_args(feature))

    def _check_count(self, features: Sequence[Feature]) -> None:
        if len(features) != len(self._slots):
            raise ValueError(f"{len(self._slots)} bags but {len(features)} features")

    def _plans(
        self, bags: list[EmbeddingBag], features: Sequence[Feature], inputs: list[Feature]
    ) -> list[Lookup]:
        """The plans ``prefetch`` made for these features, else new ones (for ``inputs``,
        the features as one input per table)."""
        if not torch.compiler.is_compiling():  # comparing features reads them: not in a graph
            ahead, self._ahead = self._ahead, None
            if ahead is not None and same_features(ahead[0], features):
                return ahead[1]
        return [self._plan(bag, feature) for bag, feature in zip(bags, inputs, strict=True)]

    def forward(self, features: Sequence[Feature]) -> list[torch.Tensor]:
        """One input per feature, in order; the pooled output of each, in order."""
        grouped = self._grouped_step(features, joined=False)
        if grouped is not None:
            return grouped  # type: ignore[return-value]
        bags, plans, counts = self._bags_and_plans(features)
        outputs = self._outputs(bags, plans)
        return split(outputs, self._served, counts) if self._shared else outputs

    def concat(self, features: Sequence[Feature]) -> torch.Tensor:
        """The bags' outputs side by side, [batch, sum of dims]: ``torch.cat(self(features),
        dim=1)``, without the copy where it can be left out.

        When every bag is a plain sum/mean bag (pooled by the engine), each table's
        bags are pooled straight into its columns of one output and backward hands
        each table its columns of the one gradient (``recstore.client.pooled_cat``);
        otherwise the outputs are concatenated. A collection the engine serves as one
        group (``recstore.client.grouped``) pools every table in one call instead.
        """
        grouped = self._grouped_step(features, joined=True)
        if grouped is not None:
            return grouped  # type: ignore[return-value]
        if self._shared:
            return torch.cat(self(features), dim=1)
        bags, plans, _ = self._bags_and_plans(features)
        pairs = zip(bags, plans, strict=True)
        if all(plan.pooled(bag.client, bag.table_name) for bag, plan in pairs):
            return dispatch.pool_cat(
                self._anchor,
                [bag._handle for bag in bags],
                [plan.ids for plan in plans],
                [plan.offsets for plan in plans],
                [plan.pool for plan in plans],  # type: ignore[misc]
                [bag.takes_gradients for bag in bags],
            )
        return torch.cat(self._outputs(bags, plans), dim=1)

    def _grouped_step(
        self, features: Sequence[Feature], joined: bool
    ) -> torch.Tensor | list[torch.Tensor] | None:
        """The step as one engine call per direction, or None when the features or the
        tables need the general path (which also refuses what torch refuses)."""
        group = self._group
        if not self._grouped or group is None or len(features) != len(self._slots):
            return None
        first = features[0]
        if dispatch.tracing([first if isinstance(first, torch.Tensor) else first[0]]):
            if not all(isinstance(f, torch.Tensor) and f.dim() == 2 for f in features):
                return None  # traced: fixed-size bags only (offsets are not read in a graph)
            out = traced_pool_group(self._anchor, group, list(features))  # type: ignore[arg-type]
            if group.shared:
                return group.unfold(out, int(first.shape[0]), joined)  # type: ignore[union-attr]
            if joined:
                return out if group.cat_dtype == torch.float32 else out.to(group.cat_dtype)
            columns = out.split(group.dims, 1)
            return [c.to(d) for c, d in zip(columns, group.dtypes, strict=True)]
        batch = group.batch(features)
        if batch is None:
            return None
        self._ahead = None
        if group.shared:
            joined_out = pool_group(self._anchor, group, batch, True)
            return group.unfold(joined_out, batch.bags // group.copies, joined)  # type: ignore[arg-type]
        return pool_group(self._anchor, group, batch, joined)

    def _bags_and_plans(
        self, features: Sequence[Feature]
    ) -> tuple[list[EmbeddingBag], list[Lookup], list[list[int]]]:
        """Each table's plan (a shared table's features joined) and, per table, its
        features' numbers of bags (``shared_features.fold``)."""
        self._check_count(features)
        bags: list[EmbeddingBag] = list(self.bags)  # type: ignore[arg-type]
        inputs, counts = fold(bags, self._served, features)
        return bags, self._plans(bags, features, inputs), counts

    def _outputs(self, bags: list[EmbeddingBag], plans: list[Lookup]) -> list[torch.Tensor]:
        out: list[torch.Tensor | None] = [None] * len(plans)
        pooled = [
            i for i, plan in enumerate(plans) if plan.pooled(bags[i].client, bags[i].table_name)
        ]
        if len(pooled) < len(plans) and not dispatch.tracing([p.ids for p in plans]):
            # other bags read rows anyway: remote ones read with them, in one request a node
            pooled = [i for i in pooled if pools_in_engine(bags[i].client, bags[i].table_name)]
        if pooled:  # plain sum/mean bags: pooled by the engine where it applies
            results = dispatch.pool_many(
                self._anchor,
                [bags[i]._handle for i in pooled],
                [plans[i].ids for i in pooled],
                [plans[i].offsets for i in pooled],
                [plans[i].pool for i in pooled],  # type: ignore[misc]
                [bags[i].takes_gradients for i in pooled],
            )
            for i, result in zip(pooled, results, strict=True):
                out[i] = result
        rest = [i for i in range(len(plans)) if out[i] is None]
        if rest:
            rows = dispatch.lookup_many(
                self._anchor,
                [bags[i]._handle for i in rest],
                [plans[i].ids for i in rest],
                [_padding(bags[i]) for i in rest],
                [plans[i].scale_grad_by_freq for i in rest],
                [bags[i].takes_gradients for i in rest],
            )
            for i, r in zip(rest, rows, strict=True):
                out[i] = plans[i].finish(r)
        return out  # type: ignore[return-value]

    @property
    def feature_tables(self) -> list[str]:
        """The table each feature is looked up in, in the features' order."""
        return [str(self.bags[t].table_name) for t in self._slots]

    def extra_repr(self) -> str:
        if self._shared:
            return f"tables={self.table_names}, feature_tables={self.feature_tables}"
        return f"tables={self.table_names}"


def _tables(
    tables: Sequence[EmbeddingBag | EmbeddingBagConfig], client: RecStoreClient | None
) -> tuple[list[EmbeddingBag], list[int]]:
    """The distinct bags, and for each feature its bag's index: a bag (or config) listed
    at several places is one table serving each of those features."""
    bags: list[EmbeddingBag] = []
    slots: list[int] = []
    seen: dict[int, int] = {}  # id of a listed bag or config -> its bag's index
    names: dict[str, int] = {}
    for table in tables:
        if id(table) in seen:
            slots.append(seen[id(table)])
            continue
        if isinstance(table, EmbeddingBagConfig):
            bag = table.build(client)
        elif isinstance(table, EmbeddingBag):
            bag = table
        else:
            raise TypeError(
                "tables must be recstore.nn.EmbeddingBag modules or EmbeddingBagConfig, "
                f"got {type(table).__name__}"
            )
        name = str(bag.table_name)
        if name in names:
            raise ValueError(
                f"table {name!r} is listed as two different modules: a table serving "
                "several features is the same EmbeddingBag (or EmbeddingBagConfig) listed "
                "at each of their places"
            )
        seen[id(table)] = names[name] = len(bags)
        slots.append(len(bags))
        bags.append(bag)
    return bags, slots


def _padding(bag: EmbeddingBag) -> int:
    return NO_PADDING if bag.padding_idx is None else bag.padding_idx


def _group_of(bags: list[EmbeddingBag], slots: list[int]) -> TableGroup | None:
    """The group that serves these bags in one call per direction, where one does."""
    if TableGroup.serves(bags):
        return TableGroup(bags, slots)
    if RemoteGroup.serves(bags):
        return RemoteGroup(bags, slots)
    return None
