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

from collections.abc import Sequence
from typing import Any

import torch

from recstore.client.nve.config import LayerType
from recstore.client.nve.layers import NVEmbeddingBag, TablesLookup, runs_eagerly

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

    @runs_eagerly
    def forward(self, features: Sequence[Feature]) -> list[torch.Tensor]:
        layers: list[NVEmbeddingBag] = list(self.layers)  # type: ignore[arg-type]
        if len(features) != len(layers):
            raise ValueError(f"{len(layers)} layers but {len(features)} features")
        args = [_feature_args(feature) for feature in features]
        keys = [layer._distinct(k) for layer, (k, _, _) in zip(layers, args, strict=True)]
        for layer in layers:  # every layer's keys checked before any state moves
            layer._begin_lookup()
        rows = TablesLookup.apply(self._anchor, layers, *(distinct for distinct, _ in keys))
        return [
            layer._pool(r, inverse, offsets, weights)
            for layer, r, (_, inverse), (_, offsets, weights) in zip(
                layers, rows, keys, args, strict=True
            )
        ]

    def exported_forward(self, features: Sequence[Feature]) -> list[torch.Tensor]:
        """What ``torch.export`` traces: each layer's own exported lookup."""
        if len(features) != len(self.layers):
            raise ValueError(f"{len(self.layers)} layers but {len(features)} features")
        layers: list[NVEmbeddingBag] = list(self.layers)  # type: ignore[arg-type]
        return [
            layer.exported_forward(*_feature_args(feature))
            for layer, feature in zip(layers, features, strict=True)
        ]
