"""Tables shared by several features of an ``EmbeddingBagCollection``.

As torchrec allows (``EmbeddingBagConfig(feature_names=[...])``), one table
may serve several features: the same ``recstore.nn.EmbeddingBag`` listed at
each feature's place. Torch's reference is one ``nn.EmbeddingBag`` applied to
each input with the loss summing them: the table's gradient is the sum of its
features', one optimizer step per row. Table by table (and remotely) the
features of a shared table are joined into one input of all their bags: one
lookup, one update with every duplicate id merged; its output is split back
into the features' outputs (``join``, ``split``). The grouped local path lays
a shared table's features out the same way (``recstore.client.grouped``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from recstore.client.nn import EmbeddingBag

#: one feature's input: 2-D ids, or (ids, offsets), or (ids, offsets, per_sample_weights)
Feature = torch.Tensor | tuple[torch.Tensor, ...]


def feature_args(feature: Feature) -> tuple[Any, ...]:
    if isinstance(feature, torch.Tensor):
        return (feature,)
    if isinstance(feature, tuple | list) and 1 <= len(feature) <= 3:
        return tuple(feature)
    raise TypeError(
        "each feature is 2-D ids, (ids, offsets) or (ids, offsets, per_sample_weights), "
        f"got {type(feature).__name__}"
    )


def members(slots: Sequence[int], tables: int) -> list[list[int]]:
    """For each table, the features it serves (their places in the input), in order."""
    served: list[list[int]] = [[] for _ in range(tables)]
    for feature, table in enumerate(slots):
        served[table].append(feature)
    return served


def _bags(bag: EmbeddingBag, feature: Feature) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """One feature as 1-D ids, the start of each of its bags, and its weights (or None);
    refused as torch refuses it."""
    args = feature_args(feature)
    ids, offsets, weights = (*args, None, None)[:3]
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids must be a tensor, got {type(ids).__name__}")
    if ids.dim() == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None")
        starts = torch.arange(ids.shape[0], device=ids.device) * ids.shape[1]
        return ids.reshape(-1), starts, weights if weights is None else weights.reshape(-1)
    if ids.dim() != 1:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got {ids.dim()} dimensions")
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        raise ValueError("offsets has to be a 1D Tensor")
    if bag.include_last_offset:
        if offsets.numel() == 0:
            raise ValueError("include_last_offset: the offsets need at least one entry")
        offsets = offsets[:-1]
    if not torch.compiler.is_compiling() and offsets.numel() and int(offsets[0]) != 0:
        raise ValueError(f"offsets[0] has to be 0, got {int(offsets[0])}")
    return ids, offsets, weights


def join(bag: EmbeddingBag, features: Sequence[Feature]) -> tuple[Feature, list[int]]:
    """The features of one table as one input of all their bags (in order), and the
    number of bags of each."""
    parts = [_bags(bag, feature) for feature in features]
    ids, starts, base = [], [], 0
    for keys, offsets, _ in parts:
        ids.append(keys.to(torch.int64))
        starts.append(offsets.to(torch.int64) + base)
        base += keys.numel()
    if bag.include_last_offset:
        starts.append(torch.tensor([base], device=ids[0].device))
    joined: tuple[torch.Tensor, ...] = (torch.cat(ids), torch.cat(starts))
    if any(w is not None for _, _, w in parts):
        joined += (torch.cat([torch.ones(k.shape, device=k.device) if w is None else w
                              for k, _, w in parts]),)  # fmt: skip
    return joined, [offsets.shape[0] for _, offsets, _ in parts]


def fold(
    bags: Sequence[EmbeddingBag], served: list[list[int]], features: Sequence[Feature]
) -> tuple[list[Feature], list[list[int]]]:
    """One input per table (a shared table's features joined), and each table's features'
    numbers of bags (empty for a table of one feature: its output is the feature's)."""
    inputs: list[Feature] = []
    counts: list[list[int]] = []
    for bag, mine in zip(bags, served, strict=True):
        if len(mine) == 1:
            inputs.append(features[mine[0]])
            counts.append([])
        else:
            joined, sizes = join(bag, [features[f] for f in mine])
            inputs.append(joined)
            counts.append(sizes)
    return inputs, counts


def split(
    outputs: Sequence[torch.Tensor], served: list[list[int]], counts: list[list[int]]
) -> list[torch.Tensor]:
    """``fold``'s outputs per table back to one output per feature, in the input's order."""
    features = sum(len(mine) for mine in served)
    out: list[torch.Tensor | None] = [None] * features
    for output, mine, sizes in zip(outputs, served, counts, strict=True):
        parts = output.split(sizes, 0) if sizes else (output,)
        for feature, part in zip(mine, parts, strict=True):
            out[feature] = part
    return out  # type: ignore[return-value]


def same_features(a: Sequence[Feature], b: Sequence[Feature]) -> bool:
    """Whether two batches of features are equal (the same tensors, or equal ones)."""
    if len(a) != len(b):
        return False
    for left, right in zip(a, b, strict=True):
        if left is right:
            continue
        lefts, rights = feature_args(left), feature_args(right)
        if len(lefts) != len(rights):
            return False
        for x, y in zip(lefts, rights, strict=True):
            if x is not y and (
                not isinstance(x, torch.Tensor)
                or not isinstance(y, torch.Tensor)
                or x.shape != y.shape
                or x.dtype != y.dtype
                or not torch.equal(x, y)
            ):
                return False
    return True
