"""Bag pooling is written once (``recstore.client.bags``) and every module calls it."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import recstore.client
from recstore.client import bags

#: what computes pooled bags: torch's op (either way in), the engine's distinct-row pooling
POOLING_CALLS = {"embedding_bag", "_embedding_bag", "pool_distinct_bags", "unpool_distinct_bags"}


def test_no_client_module_pools_bags_but_the_one() -> None:
    root = Path(recstore.client.__file__).parent
    pooling = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = {
            node.func.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        }
        if calls & POOLING_CALLS:
            pooling[str(path.relative_to(root))] = sorted(calls & POOLING_CALLS)
    assert pooling == {"bags.py": sorted(POOLING_CALLS)}


def test_the_bag_count_of_sized_and_offset_bags() -> None:
    keys = torch.arange(12)
    assert bags.bag_count(keys, None, 3) == 4
    assert bags.bag_count(keys, torch.tensor([0, 5, 5, 9]), bags.SEGMENTS) == 4


def test_uniform_bags_are_told_from_uneven_ones_by_their_offsets() -> None:
    assert bags.uniform_bag_size(bags.bag_starts(12, 3, torch.int64, torch.device("cpu")), 12) == 3
    assert bags.uniform_bag_size(torch.tensor([0, 3, 7, 9]), 12) == 0
    assert bags.uniform_bag_size(torch.tensor([0, 5]), 12) == 0  # 12 ids do not split in 2 of 5


def test_sized_and_offset_bags_pool_to_torchs_numbers() -> None:
    """The two forms of plain bags, and torch's op, pool the same ids into each bag (rows
    of small integers: exact in float32 whatever order a sum takes)."""
    generator = torch.Generator().manual_seed(3)
    rows = torch.randint(-50, 50, (12, 5), generator=generator).float()
    index = torch.arange(12)
    offsets = bags.bag_starts(12, 4, torch.int64, torch.device("cpu"))
    for mean, mode in ((False, "sum"), (True, "mean")):
        sized = bags.pool_rows(rows, bags.Pool(4, mean))
        segments = bags.pool_rows(rows, bags.Pool(bags.SEGMENTS, mean), offsets)
        torch_op = bags.embedding_bag(index.view(3, 4), rows, None, mode, None)
        torch.testing.assert_close(sized, torch_op, rtol=0, atol=0)
        torch.testing.assert_close(segments, torch_op, rtol=0, atol=0)
