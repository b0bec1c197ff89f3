"""Reads and gradient updates of NVE layers' tables, for one layer or several at once.

An ``NVEmbeddingBag`` looks up each distinct key of a batch once (its bags are
pooled from those rows, and its backward sums each key's gradient in torch's
pooling backward), so what reaches these functions are the distinct keys of
each layer. ``read_tables`` serves each layer's keys from its cache where it
has one and pulls everything else with one ``pull_many`` (one MultiPull per
node); ``send_updates`` hands every layer's gradient over as one multi-table
update per ``max_modify_size`` chunk. A single layer is the case of one, so a
layer alone and a collection of layers compute the same rows and updates.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from recstore.client.backends.base import PullRequest
from recstore.client.lookup import Gradient, send_gradients
from recstore.client.nve.cached import StaleLookup
from recstore.client.nve.config import modify_chunks
from recstore.client.op_tables import resolve


def read_tables(layers: Sequence[Any], keys: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The rows of each layer's distinct (checked, flat CPU int64) ``keys``, in order."""
    refs = [resolve(layer._handle) for layer in layers]
    requests: list[PullRequest] = []
    plans: list[tuple[int | None, StaleLookup | None]] = []  # per layer: request index, lookup
    rows: list[Any] = [None] * len(layers)
    for i, (layer, ref, flat) in enumerate(zip(layers, refs, keys, strict=True)):
        cached = layer._cached
        if layer._device_table is not None:  # GPULayer / LinearUVM: read on the GPU
            rows[i] = layer._device_table.read(flat)
            plans.append((None, None))
        elif layer._tiers is not None:  # a GPU cache in front: its misses go down on their own
            rows[i] = layer._tiers.read(flat)
            plans.append((None, None))
        elif cached is not None and cached.max_staleness_steps is None:
            rows[i] = cached.read(flat)  # exact: the cache compares versions on its own pull
            plans.append((None, None))
        elif cached is not None:
            lookup = cached.stale_lookup(flat)
            asked = len(requests) if lookup.misses.numel() else None
            if asked is not None:
                requests.append(lookup.request)
            plans.append((asked, lookup))
        else:
            plans.append((len(requests), None))
            requests.append((ref.name, flat, True))
    pulled = refs[0].client._for_modules.pull_many(requests) if requests else []
    for i, (layer, (asked, lookup)) in enumerate(zip(layers, plans, strict=True)):
        got = None if asked is None else pulled[asked]
        if lookup is not None:
            rows[i] = layer._cached.stale_finish(lookup, got)
        elif got is not None:
            rows[i] = got
    return rows


def update_chunks(
    layer: Any, keys: torch.Tensor, grad: torch.Tensor, unique: bool
) -> list[Gradient]:
    """A lookup's gradient as the table updates it becomes, in order: ``max_modify_size``
    keys each (all at once when unset)."""
    grad = grad.to(keys.device)  # a GPU cache hands out rows on the layer's device
    return [
        Gradient(layer._handle, keys[part], grad[part], unique=unique)
        for part in modify_chunks(keys.numel(), layer.settings.max_modify_size)
    ]


def write_gradients(
    layers: Sequence[Any], keys: Sequence[torch.Tensor], grads: Sequence[Any], unique: bool
) -> None:
    """Each trainable layer's gradient (None: the layer got none) to its table: a GPU
    layer's straight to its in-process table, the others' as ``send_updates`` does."""
    remote = []
    for layer, k, grad in zip(layers, keys, grads, strict=True):
        if grad is None or not layer.takes_gradients:  # inference, or frozen
            continue
        if layer._device_table is not None:
            layer._device_table.update(k, grad, layer.settings.max_modify_size)
        else:
            remote.append(update_chunks(layer, k, grad, unique=unique))
    send_updates(remote)


def send_updates(chunks: Sequence[list[Gradient]]) -> None:
    """Each table's chunks in order; chunk r of every table in one multi-table update."""
    for parts in itertools.zip_longest(*chunks):
        send_gradients([part for part in parts if part is not None])


class TablesLookup(torch.autograd.Function):
    """The rows of NVEmbeddingBag layers' distinct keys (``read_tables``); backward:
    every trainable layer's gradient (one row per key, summed by torch's pooling
    backward) in one multi-table update per chunk (``send_updates``)."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, layers: list[Any], *keys: Any) -> Any:
        ctx.layers = layers
        ctx.save_for_backward(*keys)
        rows = read_tables(layers, keys)
        ctx.mark_non_differentiable(
            *(r for layer, r in zip(layers, rows, strict=True) if not layer.optimize_for_training)
        )
        return tuple(rows)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        keys = ctx.saved_tensors
        write_gradients(ctx.layers, keys, grads, unique=True)
        return (None, None, *(None for _ in keys))
