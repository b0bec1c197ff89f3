"""A ``storage: gpu_cache`` table in the SDK's in-process store: served on a GPU,
refused with the PS node's status (FAILED_PRECONDITION) and a clear reason without one."""

from __future__ import annotations

import numpy as np
import pytest

from recstore import _native
from recstore.client.backends.local import LocalBackend
from recstore.client.errors import BackendError
from recstore.core import TableSpec
from recstore.store import Store


def cached_spec() -> TableSpec:
    return TableSpec(
        name="cached", num_embeddings=100, embedding_dim=4, storage="gpu_cache",
        gpu_cache={"rows": 100},
    )  # fmt: skip


@pytest.mark.skipif(_native.cuda_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_local_store_refuses_the_tier() -> None:
    backend = LocalBackend(Store())
    with pytest.raises(BackendError) as refused:
        backend.create_table(cached_spec())
    assert refused.value.code == "FAILED_PRECONDITION"
    assert "storage: gpu_cache" in refused.value.reason
    assert backend.describe("cached") is None


@pytest.mark.gpu
@pytest.mark.skipif(not _native.cuda_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_local_store_serves_the_tier() -> None:
    store = Store()
    LocalBackend(store).create_table(cached_spec())
    table = store.get("cached")
    keys = np.arange(20, dtype=np.int64)
    assert np.array_equal(table.pull(keys), table.pull(keys))
    assert table.stats()["cache_hits"] == 20


def test_init_data_metadata_sizes_the_cache() -> None:
    from recstore.client.specs import build_spec

    spec = build_spec(
        "t", (1000, 8), "float32", metadata={"storage": "gpu_cache", "gpu_cache": {"rows": 50}}
    )
    assert spec.storage == "gpu_cache" and spec.cache.rows == 50
