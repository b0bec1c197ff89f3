"""The inputs both group paths' tests step with (local ``grouped``, remote ``remote_group``)."""

from __future__ import annotations

from typing import Any

import torch

BAGS = 6


def mixed_features(step: int, weighted: bool = True) -> list[Any]:
    """One batch for five tables (ids below 50, 3, 5000, 8 and any): 2-D ids, ragged
    offsets with an empty bag, per-sample weights, heavy duplicates, and a feature with
    no ids at all."""
    g = torch.Generator().manual_seed(100 + step)
    ragged = torch.randint(0, 3, (9,), generator=g)
    weights = torch.rand(BAGS * 2, generator=g)
    return [
        torch.randint(0, 50, (BAGS, 4), generator=g),
        (ragged, torch.tensor([0, 2, 2, 5, 8, 8])),
        (torch.randint(0, 5000, (BAGS * 2,), generator=g), torch.arange(0, 12, 2),
         *((weights,) if weighted else ())),
        (torch.tensor([2, 7, 2, 7, 7, 1, 2]), torch.tensor([0, 1, 3, 3, 5, 6])),
        (torch.empty(0, dtype=torch.int64), torch.zeros(BAGS, dtype=torch.int64)),
    ]  # fmt: skip
