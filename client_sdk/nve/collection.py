"""``NVEmbeddingBagCollection``: several ``NVEmbeddingBag`` layers looked up and trained together.

Layer by layer, a step of eight tables over gRPC is eight MultiPulls per node
one after the other (eight round trips) and eight updates. A collection of
layers bound to one client reads every layer's rows with one MultiPull per
node (each layer's cache hits stay local; only the misses join the pull) and
hands every layer's gradient to the tables' optimizers in one multi-table
update (one MultiUpdate per node, held to ride on the next pull). Each layer
still computes exactly what it computes alone: its keys checked as it checks
them, its cache read as it reads it, its rows pooled by its own ``mode``,
its gradient cut into ``max_modify_size`` chunks applied in order. Layers
with an exact cache (inference tables) keep their own versioned pull.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from recstore.client.backends.base import PullRequest
from recstore.client.lookup import send_gradients
from recstore.client.nve.cached import StaleLookup
from recstore.client.nve.config import LayerType
from recstore.client.nve.layers import NVEmbeddingBag, update_chunks
from recstore.client.op_tables import resolve

#: one layer's input: keys, or (keys, offsets), or (keys, offsets, per_sample_weights)
Feature = torch.Tensor | tuple[torch.Tensor, ...]


def _feature_args(feature: Feature) -> tuple[torch.Tensor, Any, Any]:
    if isinstance(feature, torch.Tensor):
        return feature, None, None
    if isinstance(feature, tuple | list) and 1 <= len(feature) <= 3:
        keys, offsets, weights = (*feature, None, None)[:3]
        if isinstance(keys, torch.Tensor):
            return keys, offsets, weights
    raise TypeError(
        "each feature is keys, (keys, offsets) or (keys, offsets, per_sample_weights), "
        f"got {type(feature).__name__}"
    )


def read_together(layers: Sequence[NVEmbeddingBag], keys: Sequence[torch.Tensor]) -> list[Any]:
    """One row per element of each layer's (checked, flat) ``keys``: one ``pull_many``."""
    refs = [resolve(layer._handle) for layer in layers]
    modules = refs[0].client._for_modules
    requests: list[PullRequest] = []
    plans: list[tuple[int | None, Any]] = []  # per layer: its request's index, what to finish
    rows: list[Any] = [None] * len(layers)
    for i, (layer, ref, flat) in enumerate(zip(layers, refs, keys, strict=True)):
        cached = layer._cached
        if cached is not None and cached.max_staleness_steps is None:
            rows[i] = cached.read(flat)  # exact: the cache compares versions on its own pull
            plans.append((None, None))
        elif cached is not None:
            lookup = cached.stale_lookup(flat)
            asked = len(requests) if lookup.misses.numel() else None
            if asked is not None:
                requests.append(lookup.request)
            plans.append((asked, lookup))
        else:
            wire, unique, inverse = modules.wire_keys(flat)
            plans.append((len(requests), inverse))
            requests.append((ref.name, wire, unique))
    pulled = modules.pull_many(requests) if requests else []
    for i, (layer, (asked, plan)) in enumerate(zip(layers, plans, strict=True)):
        got = None if asked is None else pulled[asked]
        if isinstance(plan, StaleLookup):
            assert layer._cached is not None
            rows[i] = layer._cached.stale_finish(plan, got)
        elif got is not None:
            rows[i] = got if plan is None else got.index_select(0, plan)
    return rows


class _TablesLookup(torch.autograd.Function):
    """Every layer's rows in one read; backward: every layer's gradient in one update."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, layers: list[NVEmbeddingBag], *keys: Any) -> Any:
        ctx.layers = layers
        ctx.save_for_backward(*keys)
        rows = read_together(layers, keys)
        ctx.mark_non_differentiable(
            *(r for layer, r in zip(layers, rows, strict=True) if not layer.optimize_for_training)
        )
        return tuple(rows)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        keys = ctx.saved_tensors
        chunks = [
            update_chunks(layer, k, grad)
            for layer, k, grad in zip(ctx.layers, keys, grads, strict=True)
            if grad is not None and layer.optimize_for_training
        ]
        # chunk r of every table in one multi-table update; a table's chunks stay in order
        for parts in itertools.zip_longest(*chunks):
            send_gradients([part for part in parts if part is not None])
        return (None, None, *(None for _ in keys))


class NVEmbeddingBagCollection(torch.nn.Module):
    """``NVEmbeddingBag`` layers of one client with one request per PS node and step.

    ``forward(features)``: one input per layer, in order (keys, or (keys,
    offsets), or (keys, offsets, per_sample_weights), as ``NVEmbeddingBag``
    takes them); the pooled output of each layer, in order.
    """

    def __init__(self, layers: Sequence[NVEmbeddingBag]) -> None:
        super().__init__()
        if not layers:
            raise ValueError("an NVEmbeddingBagCollection needs at least one layer")
        for layer in layers:
            if not isinstance(layer, NVEmbeddingBag):
                raise TypeError(
                    f"layers must be recstore.nve.NVEmbeddingBag, got {type(layer).__name__}"
                )
            if layer.layer_type is not LayerType.Hierarchical:
                raise ValueError(
                    f"layer {layer.name} is LayerType.{layer.layer_type.name}: a collection "
                    "reads RecStore tables (LayerType.Hierarchical)"
                )
        if len({id(layer.storage.client) for layer in layers}) != 1:
            raise ValueError("every layer of a collection must use the same RecStoreClient")
        names = [layer.storage.name for layer in layers]
        if len(set(names)) != len(names):
            raise ValueError(f"a table may appear only once in a collection, got {names}")
        self.layers = torch.nn.ModuleList(layers)
        trains = any(layer.optimize_for_training for layer in layers)
        self._anchor = torch.empty(0, requires_grad=trains)  # not a Parameter

    def forward(self, features: Sequence[Feature]) -> list[torch.Tensor]:
        layers: list[NVEmbeddingBag] = list(self.layers)  # type: ignore[arg-type]
        if len(features) != len(layers):
            raise ValueError(f"{len(layers)} layers but {len(features)} features")
        args = [_feature_args(feature) for feature in features]
        flats = [layer._keys(keys) for layer, (keys, _, _) in zip(layers, args, strict=True)]
        for layer in layers:  # every layer's keys checked before any state moves
            layer._begin_lookup()
        rows = _TablesLookup.apply(self._anchor, layers, *flats)
        return [
            layer._pool(layer._end_lookup(r), keys, offsets, weights)
            for layer, r, (keys, offsets, weights) in zip(layers, rows, args, strict=True)
        ]
