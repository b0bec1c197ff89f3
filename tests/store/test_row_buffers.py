"""Large pull outputs come from recycled host blocks: new arrays, never shared while alive."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from recstore import _native
from recstore.core import TableSpec
from recstore.store import Table

DIM = 64
#: ids whose float32 rows fill more than the pooled threshold
BIG = _native.pooled_bytes // (DIM * 4) + 1


@pytest.fixture(autouse=True)
def no_cached_blocks() -> None:
    gc.collect()
    _native.release_cached_rows()


def _table(dtype: str = "float32") -> Table:
    spec = TableSpec(
        name="t", num_embeddings=200_000, embedding_dim=DIM, dtype=dtype,
        initializer={"kind": "normal", "std": 0.1, "seed": 1},
    )  # fmt: skip
    return Table(spec)


def _address(x: np.ndarray | torch.Tensor) -> int:
    return int(x.data_ptr()) if isinstance(x, torch.Tensor) else int(x.ctypes.data)


@pytest.mark.parametrize("flavour", ["numpy", "torch"])
def test_live_outputs_never_share_memory_and_keep_their_rows(flavour: str) -> None:
    table = _table()
    ids = [np.random.default_rng(i).integers(0, 200_000, BIG) for i in range(3)]
    batches = [torch.from_numpy(k) for k in ids] if flavour == "torch" else ids
    first = table.pull(batches[0])
    expected = (first.numpy() if isinstance(first, torch.Tensor) else first).copy()
    held = [first, table.pull(batches[1]), table.pull(batches[2])]
    assert len({_address(x) for x in held}) == 3
    np.testing.assert_array_equal(np.asarray(held[0]), expected)  # later pulls wrote elsewhere


def test_a_freed_output_block_is_reused_with_the_new_rows() -> None:
    table = _table()
    keys = torch.from_numpy(np.random.default_rng(0).integers(0, 200_000, BIG))
    first = table.pull(keys)
    where, expected = first.data_ptr(), first.clone()
    del first
    assert _native.cached_row_bytes() >= BIG * DIM * 4  # back in the cache, not unmapped
    other = torch.from_numpy(np.random.default_rng(1).integers(0, 200_000, BIG))
    again = table.pull(other)
    assert again.data_ptr() == where  # no fresh memory to fault in
    assert _native.cached_row_bytes() == 0
    assert not torch.equal(again, expected)
    np.testing.assert_array_equal(again.numpy(), table.pull(other.numpy()))


@pytest.mark.parametrize(
    ("dtype", "torch_dtype", "numpy_dtype"),
    [
        ("float32", torch.float32, np.float32),
        ("float16", torch.float16, np.float16),
        ("bfloat16", torch.bfloat16, np.uint16),
    ],
)
def test_outputs_have_the_table_dtype_in_each_flavour(
    dtype: str, torch_dtype: torch.dtype, numpy_dtype: type
) -> None:
    table = _table(dtype)
    keys = np.arange(2 * BIG) % 200_000
    rows = table.pull(torch.from_numpy(keys))
    assert rows.dtype == torch_dtype and rows.shape == (2 * BIG, DIM) and rows.is_contiguous()
    flat = table.pull(keys)
    assert flat.dtype == numpy_dtype and flat.flags.c_contiguous and flat.flags.writeable
    assert torch.equal(rows.view(torch.int16), torch.from_numpy(flat.view(np.int16)))


def test_the_block_cache_is_bounded() -> None:
    table = _table()
    keys = np.random.default_rng(3).integers(0, 200_000, 4 * BIG)
    outputs = [table.pull(keys) for _ in range(12)]  # 12 live blocks of 4 MiB
    del outputs
    gc.collect()
    assert _native.cached_row_bytes() <= 8 * (4 * BIG * DIM * 4 + (2 << 20))  # 8 blocks kept


def test_new_rows_refuses_a_bad_shape_or_dtype() -> None:
    with pytest.raises(ValueError, match="rows >= 0 and width >= 1"):
        _native.new_rows(-1, 4, 0, True)
    with pytest.raises(ValueError, match="dtype must be float32, float16 or bfloat16"):
        _native.new_rows(10, 4, 7, False)
    assert _native.cached_row_bytes() == 0
