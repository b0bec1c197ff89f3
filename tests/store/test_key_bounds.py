"""The engine's bounds of a key batch, which the SDK's dense id check uses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recstore import _native
from recstore.client.errors import IdOutOfRange
from recstore.client.tensors import check_id_range, id_bounds


@pytest.mark.parametrize("n", [1, 7, 65_536, 300_001])
def test_bounds_match_numpy_over_every_range_split(n: int) -> None:
    keys = np.random.default_rng(n).integers(-(2**62), 2**62, n)
    keys[n // 3] = np.iinfo(np.int64).min if n > 1 else keys[0]
    keys[-1] = np.iinfo(np.int64).max if n > 2 else keys[-1]
    assert _native.key_bounds(keys) == (int(keys.min()), int(keys.max()))
    assert id_bounds(torch.from_numpy(keys)) == (int(keys.min()), int(keys.max()))


def test_an_empty_batch_has_no_bounds() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        _native.key_bounds(np.empty(0, np.int64))


def test_non_int64_or_strided_ids_still_get_their_bounds() -> None:
    ids = torch.arange(10, 400_010, dtype=torch.int32)
    assert id_bounds(ids) == (10, 400_009)
    strided = torch.arange(0, 1_000_000, dtype=torch.int64)[::3]
    assert id_bounds(strided) == (0, 999_999)


def test_the_dense_check_names_the_offending_id() -> None:
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 1000, 200_000))
    ids[123_456] = 1000
    with pytest.raises(IdOutOfRange, match=r"id 1000 is out of range for table 'emb': valid ids"):
        check_id_range(ids, 0, 1000, "emb")
    ids[123_456] = -5
    with pytest.raises(IdOutOfRange, match=r"id -5 is out of range"):
        check_id_range(ids, 0, 1000, "emb")
