"""unique_keys: torch.unique's distinct keys and inverse, in first-occurrence order."""

from __future__ import annotations

import pytest
import torch

from recstore.client.tensors import unique_keys

CASES = {
    "empty": torch.tensor([], dtype=torch.int64),
    "one": torch.tensor([7]),
    "repeats": torch.tensor([5, 3, 5, 9, 3, 3]),
    "extremes": torch.tensor([-(2**63), 2**63 - 1, 0, -1, 2**63 - 1, -(2**63)]),
    "zipf-like": torch.randint(0, 50, (4096,), generator=torch.Generator().manual_seed(3)),
    "all distinct": torch.randperm(3000, generator=torch.Generator().manual_seed(4)) * 977,
    "2-d int32": torch.tensor([[4, 4], [1, 2]], dtype=torch.int32),
}


@pytest.mark.parametrize("keys", CASES.values(), ids=CASES.keys())
def test_unique_keys_agree_with_torch_unique(keys: torch.Tensor) -> None:
    unique, inverse = unique_keys(keys)
    expected = torch.unique(keys.to(torch.int64))
    assert unique.dtype == inverse.dtype == torch.int64
    assert inverse.shape == keys.shape
    torch.testing.assert_close(torch.sort(unique).values, expected)  # the same set, once each
    torch.testing.assert_close(unique[inverse], keys.to(torch.int64))  # the inverse rebuilds them
    flat = keys.reshape(-1).tolist()
    first_seen = list(dict.fromkeys(flat))
    assert unique.tolist() == first_seen  # first occurrence first
