"""The CUDA side of the native module, checked on every machine, GPU or not.

A checkout built where a CUDA toolkit exists must carry the CUDA kernels, and
the module must import and answer "no device" on machines without a GPU or a
driver: the static CUDA runtime's errors are handled, never fatal.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from recstore import _native
from recstore.core import TableSpec
from recstore.store import Table


def _toolkit_present() -> bool:
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()


def _gpu_visible() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


@pytest.mark.skipif(not _toolkit_present(), reason="no CUDA toolkit on this machine")
@pytest.mark.skipif(
    os.environ.get("RECSTORE_CUDA", "").upper() == "OFF", reason="CUDA switched off for this build"
)
def test_a_toolkit_means_the_cuda_kernels_are_built_in() -> None:
    assert _native.built_with_cuda() is True
    assert callable(_native.CudaTable)
    assert callable(_native.CudaCacheTable)  # the gpu_cache tier


def test_device_queries_answer_without_raising() -> None:
    first = _native.cuda_available()
    assert isinstance(first, bool)
    assert _native.cuda_available() is first  # a failed query leaves no error behind
    if _native.built_with_cuda():
        count = _native.cuda_device_count()
        assert isinstance(count, int) and count >= 0
        assert first == (count > 0)
    if not _gpu_visible():
        assert first is False


@pytest.mark.skipif(
    not _native.built_with_cuda() or _native.cuda_available(), reason="needs a CUDA build, no GPU"
)
def test_a_cuda_table_without_a_device_fails_cleanly_and_the_cpu_engine_still_works() -> None:
    options = _native.TableOptions()
    options.dim = 4
    options.capacity = options.id_limit = 16
    with pytest.raises(RuntimeError, match="no CUDA device"):
        _native.CudaTable(options)
    cache = _native.CacheOptions()
    cache.rows = 8
    with pytest.raises(RuntimeError, match="no CUDA device"):
        _native.CudaCacheTable(options, cache)
    spec = TableSpec(name="after", num_embeddings=16, embedding_dim=4)
    table = Table(spec)
    rows = table.pull(np.arange(16, dtype=np.int64))
    assert rows.shape == (16, 4) and table.size == 16
