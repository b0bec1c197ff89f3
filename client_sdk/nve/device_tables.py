"""Where a ``GPULayer`` or ``LinearUVM`` layer keeps its rows: a table of this process's engine.

The reference's two GPU layer types own their memory: ``GPULayer`` holds every
row in GPU memory, ``LinearUVM`` holds the rows in host memory with a GPU cache
in front. RecStore's engine has both as storage tiers of a table (``storage:
gpu``, the CUDA table; ``storage: gpu_cache``, host rows written through from a
GPU cache of ``gpu_cache.bytes``), so such a layer is a table of the in-process
store, read and trained like any other: lookups run on the GPU, the gradient goes
to the table's optimizer (SGD at the client's learning rate unless a
``RemoteTable`` on an in-process client names another).
"""

from __future__ import annotations

from typing import Any

import torch

from recstore.client.client import RecStoreClient
from recstore.client.nve.config import LayerConfig, LayerType, modify_chunks
from recstore.client.nve.storage import RemoteTable
from recstore.core.cache_figures import GPU_TIER, engine_figures

#: the role of the client whose in-process tables the GPU layers own
DEVICE_TABLES_ROLE = "recstore.nve.device-tables"


def in_process_client() -> RecStoreClient:
    """The client of the GPU layers' own tables: always the in-process (local) backend."""
    client = RecStoreClient(role=DEVICE_TABLES_ROLE)
    if client.backend != "local":
        client.set_ps_backend("local")
    return client


def device_storage(layer_type: LayerType, storage: Any, name: str) -> RemoteTable:
    """The layer's table: ``storage`` (a ``RemoteTable`` on an in-process client, to
    name the table or choose its optimizer), else a new one named ``name``."""
    if storage is None:
        return RemoteTable(in_process_client(), name)
    if not isinstance(storage, RemoteTable) or storage.client.backend != "local":
        raise TypeError(
            f"LayerType.{layer_type.name} keeps its rows in this process: storage must be None "
            "or a recstore.nve.RemoteTable on an in-process (local backend) client, got "
            f"{storage!r}; a table on parameter-server nodes is LayerType.Hierarchical"
        )
    return storage


def placement(layer_type: LayerType, gpu_cache_size: int, settings: LayerConfig) -> dict[str, Any]:
    """The table spec fields that put the rows where ``layer_type`` says."""
    for key, value in (("host_cache_size", settings.host_cache_size),
                       ("max_staleness_steps", settings.max_staleness_steps)):  # fmt: skip
        if value:
            raise ValueError(
                f"config[{key!r}] applies to the host cache of LayerType.Hierarchical; "
                f"LayerType.{layer_type.name} has none (its rows are read exact)"
            )
    if layer_type is LayerType.GPULayer:
        if gpu_cache_size:
            raise ValueError(
                "LayerType.GPULayer keeps every row in GPU memory: gpu_cache_size must be 0, "
                f"got {gpu_cache_size} (LayerType.LinearUVM caches host rows on the GPU)"
            )
        return {"storage": "gpu"}
    if not gpu_cache_size:
        raise ValueError(
            "LayerType.LinearUVM reads host rows through a GPU cache: "
            "gpu_cache_size must be > 0 bytes"
        )
    return {"storage": "gpu_cache", "gpu_cache": {"bytes": gpu_cache_size}}


class DeviceTable:
    """A GPU layer's table, read and trained where its rows are: keys, rows and
    gradients stay on the GPU (the SDK's module path gathers keys on the CPU for
    the wire, which here would only cost two copies of every row)."""

    def __init__(self, storage: RemoteTable) -> None:
        from recstore.client.backends.local import LocalBackend  # what device_storage allows

        backend = storage.client.ops
        assert isinstance(backend, LocalBackend)
        self._backend, self.name = backend, storage.name

    def read(self, keys: torch.Tensor) -> torch.Tensor:
        """One row per key (int64 keys on the table's GPU; rows there too)."""
        return self._backend.pull(self.name, keys)

    def update(self, keys: torch.Tensor, grads: torch.Tensor, max_modify_size: int | None) -> None:
        """The gradient rows of ``keys`` through the table's optimizer (repeated keys
        summed), at most ``max_modify_size`` keys per engine call."""
        keys, grads = keys.contiguous(), grads.to(keys.device).contiguous()
        for part in modify_chunks(keys.numel(), max_modify_size):
            self._backend.update(self.name, keys[part], grads[part], None)

    def cache_stats(self, layer: str) -> dict[str, object] | None:
        """The table's GPU cache (a ``LinearUVM`` layer's) as ``cache_stats()`` shows it:
        the engine's counters; None for a table without one (a ``GPULayer``'s)."""
        figures = engine_figures(self._backend.table(self.name).stats())
        if figures is None:
            return None
        return {
            "table": self.name, "layer": layer, "tier": GPU_TIER, "policy": "lru",
            **figures.as_dict(), "bytes_used": figures.resident_bytes,
        }  # fmt: skip


def table_device(device: torch.device) -> torch.device:
    """The layer's device, which must be the current CUDA device: the engine's GPU
    tables live there."""
    current = torch.device("cuda", torch.cuda.current_device())
    index = device.index if device.index is not None else current.index
    if device.type != "cuda" or index != current.index:
        raise ValueError(
            f"a GPU layer's table lives on the current CUDA device ({current}), got "
            f"device={device}; call torch.cuda.set_device first"
        )
    return current
