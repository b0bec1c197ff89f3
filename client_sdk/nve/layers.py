"""``NVEmbedding`` and ``NVEmbeddingBag``: the NV Embedding Cache layer API over RecStore.

Constructor arguments and rules follow NVIDIA's ``pynve.torch.nve_layers``
(docs/sdk.md, "recstore.nve"). A ``Hierarchical`` layer reads a RecStore table
(``storage=RemoteTable(client, name)``) through an optional host cache
(``config["host_cache_size"]``, bytes) and, on a CUDA device, a GPU cache in
front of it (``gpu_cache_size``, bytes; ``device_cache``); its backward sends the
gradient rows to the table's server-side optimizer, in chunks of
``max_modify_size`` keys. An ``NVEmbeddingBag`` reads each distinct key of a
batch once and pools its bags from those rows (``batched``: the same read and
update serve one layer and an ``NVEmbeddingBagCollection``). A ``HostLayer`` is
a block of host memory for inference. ``GPULayer`` and ``LinearUVM`` own a table
of this process's engine on the GPU (``device_tables``); they need a CUDA GPU and
say so when there is none.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from recstore.client import dispatch
from recstore.client.bags import pool_indexed
from recstore.client.lookup import read_rows
from recstore.client.nve.batched import TablesLookup, write_gradients
from recstore.client.nve.cache_report import CacheReporter
from recstore.client.nve.cached import CachedTable, CacheReport, log
from recstore.client.nve.config import LayerConfig, LayerType, parse_config, resolve_device
from recstore.client.nve.device_cache import DeviceRowCache, tier_sets
from recstore.client.nve.device_cache_tiers import DeviceCachedTable
from recstore.client.nve.device_tables import (
    DeviceTable,
    device_storage,
    placement,
    table_device,
)
from recstore.client.nve.layer_state import LayerState
from recstore.client.nve.metrics import track
from recstore.client.nve.storage import RemoteTable, host_rows
from recstore.client.op_registry import NAMESPACE
from recstore.client.tensors import check_module_id_dtype, id_bounds, unique_keys

_layer_ids = itertools.count()
assert NAMESPACE == "recstore"

_Forward = TypeVar("_Forward", bound=Callable[..., Any])


def runs_eagerly(forward: _Forward) -> _Forward:
    """A layer's forward kept out of traced graphs, and its form for ``torch.export``.

    The layers keep caches and counters in Python and call the engine with real
    tensors: ``torch.compile`` runs them outside its graph (a graph break; with
    ``fullgraph=True`` torch refuses them). ``torch.export`` (``recstore.export``)
    traces a ``Hierarchical`` layer's ``exported_forward`` instead: its table's
    rows through ``torch.ops.recstore.emb_lookup``, no cache (a served package
    reads its own copy of the table, or the live one); other types are refused.
    """

    @functools.wraps(forward)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_exporting():
            return self.exported_forward(*args, **kwargs)
        return forward(self, *args, **kwargs)

    return torch.compiler.disable(guarded)


class _TableLookup(torch.autograd.Function):
    """Rows of ``keys`` read through ``layer``'s cache (or straight from the table);
    backward: the gradient to the table's optimizer."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, layer: _NVELayer, keys: torch.Tensor) -> Any:
        ctx.layer = layer
        ctx.save_for_backward(keys)
        return layer._read(keys)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        (keys,) = ctx.saved_tensors
        write_gradients([ctx.layer], [keys], [grad], unique=False)
        return None, None, None


class _NVELayer(LayerState):
    def __init__(
        self,
        num_embeddings: int,
        embedding_size: int,
        data_type: torch.dtype = torch.float32,
        layer_type: LayerType = LayerType.Hierarchical,
        gpu_cache_size: int = 0,
        weight_init: torch.Tensor | None = None,
        config: Mapping[str, Any] | None = None,
        storage: Any = None,
        optimize_for_training: bool = True,
        device: Any = None,
    ) -> None:
        super().__init__()
        if not isinstance(layer_type, LayerType):
            raise TypeError(f"layer_type must be a recstore.nve.LayerType, got {layer_type!r}")
        if num_embeddings < 1 or embedding_size < 1:
            raise ValueError(
                "num_embeddings and embedding_size must be >= 1, "
                f"got {num_embeddings}, {embedding_size}"
            )
        if layer_type is LayerType.HostLayer and optimize_for_training:
            raise ValueError(
                "LayerType.HostLayer is inference-only: pass optimize_for_training=False"
            )
        if gpu_cache_size < 0:
            raise ValueError(f"gpu_cache_size must be >= 0 bytes, got {gpu_cache_size}")
        shape = (num_embeddings, embedding_size)
        if weight_init is not None and tuple(weight_init.shape) != shape:
            raise ValueError(
                f"weight_init must have shape {list(shape)}, got {list(weight_init.shape)}"
            )
        self.settings: LayerConfig = parse_config(config)
        self.device = resolve_device(layer_type, device, gpu_cache_size)
        self.num_embeddings, self.embedding_size = num_embeddings, embedding_size
        self.data_type, self.layer_type = data_type, layer_type
        self.gpu_cache_size = gpu_cache_size
        self.optimize_for_training = optimize_for_training
        self.name = f"nve_{next(_layer_ids)}"
        self._lookups = 0
        self._cached: CachedTable | None = None
        self._tiers: DeviceCachedTable | None = None
        self._host: torch.Tensor | None = None
        self._device_table: DeviceTable | None = None  # GPULayer / LinearUVM
        if layer_type is LayerType.HostLayer:
            self._host = host_rows(storage, shape, data_type, weight_init)
        elif layer_type is LayerType.Hierarchical:
            if gpu_cache_size:  # refused before the table is touched
                tier_sets(gpu_cache_size, embedding_size, data_type)
            self._bind(storage, weight_init)
        else:  # GPULayer / LinearUVM (resolve_device refused them without a GPU)
            where = placement(layer_type, gpu_cache_size, self.settings)
            self.device = table_device(self.device)
            self.storage = device_storage(layer_type, storage, self.name)
            self._handle = self.storage.bind(
                num_embeddings, embedding_size, data_type, weight_init, optimize_for_training,
                where,
            )  # fmt: skip
            self._device_table = DeviceTable(self.storage)
            if layer_type is LayerType.LinearUVM:
                track(self)  # its cache's counters in the Prometheus export
        self._anchor = torch.empty(0, requires_grad=optimize_for_training)

    def _bind(self, storage: Any, weight_init: torch.Tensor | None) -> None:
        if not isinstance(storage, RemoteTable):
            raise TypeError(
                "LayerType.Hierarchical needs storage=recstore.nve.RemoteTable(client, name), "
                f"got {type(storage).__name__}"
            )
        self.storage = storage
        self._handle = storage.bind(
            self.num_embeddings, self.embedding_size, self.data_type, weight_init,
            self.optimize_for_training,
        )  # fmt: skip
        settings = self.settings
        # training reads exact rows unless a staleness bound allows cached ones; a GPU
        # cache reads through a host cache (of 0 bytes, if none), which checks versions
        if (settings.host_cache_size or self.gpu_cache_size) and (
            not self.optimize_for_training or settings.max_staleness_steps is not None
        ):
            self._cached = CachedTable(
                storage.client, storage.name, self.name, self.embedding_size, self.data_type,
                settings.host_cache_size, policy=settings.cache_policy,
                max_staleness_steps=settings.max_staleness_steps if self.optimize_for_training
                else None,
                max_modify_size=settings.max_modify_size,
                version_check_interval=settings.version_check_interval,
            )  # fmt: skip
            if self.gpu_cache_size:
                tier = DeviceRowCache(
                    self.gpu_cache_size, self.embedding_size, self.data_type, self.device,
                    policy=settings.cache_policy,
                )  # fmt: skip
                self._tiers = DeviceCachedTable(self._cached, tier)
            self._reporter = CacheReporter(
                self._cached, settings.cache_report_interval, gpu=self._tiers
            )
            track(self)

    # -- lookups --------------------------------------------------------------------
    def _keys(self, keys: torch.Tensor) -> torch.Tensor:
        """The reference's device rule: keys on the layer's device; int64 for the table, on
        the CPU (a GPU layer's: where they are)."""
        if keys.device != self.device:
            raise ValueError(
                f"keys are on {keys.device} but the layer is on {self.device}; "
                "move them to the layer's device"
            )
        check_module_id_dtype(keys)
        # a GPU layer's table takes keys where they are; the others' go to the CPU
        where = keys.device if self._device_table is not None else "cpu"
        flat = keys.reshape(-1).to(where, torch.int64)
        smallest, largest = id_bounds(flat) if flat.numel() else (0, 0)
        if smallest < 0 or largest >= self.num_embeddings:
            raise IndexError(f"keys must lie in [0, {self.num_embeddings})")
        return flat

    def _read(self, keys: torch.Tensor) -> torch.Tensor:
        if self._device_table is not None:
            return self._device_table.read(keys)
        if self._tiers is not None:
            return self._tiers.read(keys)
        if self._cached is not None:
            return self._cached.read(keys)
        return read_rows([self._handle], [keys])[0]

    def _rows(self, keys: torch.Tensor) -> torch.Tensor:
        """One row per element of ``keys`` ([n, dim] on the layer's device)."""
        if self._host is not None:
            rows = self._host.index_select(0, self._keys(keys))
        else:
            flat = self._keys(keys)
            self._begin_lookup()
            rows = _TableLookup.apply(self._anchor, self, flat)
        return self._end_lookup(rows)

    def _exported_rows(self, keys: torch.Tensor) -> torch.Tensor:
        """One row per element of ``keys`` as the exported program reads them."""
        if self.layer_type is not LayerType.Hierarchical:
            raise RuntimeError(
                f"{type(self).__name__} of LayerType.{self.layer_type.name} cannot be exported: "
                "recstore.export packages RecStore tables (LayerType.Hierarchical layers and "
                "recstore.nn modules)"
            )
        check_module_id_dtype(keys)
        return dispatch.lookup(self._anchor, self._handle, keys.reshape(-1), None, False)

    def _begin_lookup(self) -> None:
        """A table lookup starts (its keys checked): a training step of the cache begins."""
        if self._cached is not None and self._trains:
            self._cached.step += 1

    def _end_lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """A lookup's rows on the layer's device, counted (and reported, logged when due)."""
        self._lookups += 1
        if self._cached is not None:
            self._reporter.maybe_send()
        interval = self.settings.logging_interval
        if interval and self._lookups % interval == 0:
            log.info("%s", self.log_line())
        return rows.to(self.device)

    @property
    def _trains(self) -> bool:
        return self.optimize_for_training and self.training

    # -- observability --------------------------------------------------------------
    def cache_stats(self) -> dict[str, object]:
        """Hits, misses, evictions, hit rate and bytes of this layer's host cache (top
        level) and of its GPU cache (``"gpu"``: the same keys, or None without one)."""
        if self._cached is None:
            table = None if self._host is not None else self.storage.name
            engine = None  # a LinearUVM layer: the engine's GPU cache of its table
            if self._device_table is not None:
                engine = self._device_table.cache_stats(self.name)
            if engine is not None:
                return {**engine, "enabled": True, "lookups": self._lookups, "gpu": None}
            return {"table": table, "layer": self.name, "enabled": False, "lookups": self._lookups}
        report: CacheReport = self._cached.report()
        gpu = None if self._tiers is None else self._tiers.report().as_dict()
        return {**report.as_dict(), "enabled": True, "lookups": self._lookups, "gpu": gpu}

    def report_cache_stats(self) -> None:
        """Send this layer's cache counters, each tier's, to the table's nodes now (their
        table view shows them; a layer also reports every ``cache_report_interval`` s)."""
        if self._cached is None:
            raise RuntimeError(f"layer {self.name} has no host cache to report")
        self._reporter.send()

    def log_line(self) -> str:
        """The ``logging_interval`` line: lookups and the caches' counters (GPU tier last)."""
        stats = self.cache_stats()
        if not stats["enabled"]:
            return f"nve layer={self.name} lookups={self._lookups} cache=off"
        line = (
            f"nve layer={self.name} table={stats['table']} lookups={self._lookups} "
            f"hits={stats['hits']} misses={stats['misses']} hit_rate={stats['hit_rate']:.4f} "
            f"evictions={stats['evictions']} bytes={stats['bytes_used']}/{stats['capacity_bytes']}"
        )
        gpu = stats["gpu"]
        if isinstance(gpu, dict):
            line += (
                f" gpu_hits={gpu['hits']} gpu_misses={gpu['misses']} "
                f"gpu_hit_rate={gpu['hit_rate']:.4f} gpu_evictions={gpu['evictions']} "
                f"gpu_bytes={gpu['bytes_used']}/{gpu['capacity_bytes']}"
            )
        return line

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_size}, {self.data_type}, "
            f"layer_type={self.layer_type.name}, device={self.device}"
        )


class NVEmbedding(_NVELayer):
    """torch.nn.Embedding-like: ``forward(keys)`` -> rows of shape [*keys.shape, dim]."""

    @runs_eagerly
    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        return self._rows(keys).view(*keys.shape, self.embedding_size)

    def exported_forward(self, keys: torch.Tensor) -> torch.Tensor:
        return self._exported_rows(keys).view(*keys.shape, self.embedding_size)


class NVEmbeddingBag(_NVELayer):
    """torch.nn.EmbeddingBag-like: pooled rows per bag (``mode`` sum, mean or max)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_size: int,
        data_type: torch.dtype = torch.float32,
        layer_type: LayerType = LayerType.Hierarchical,
        gpu_cache_size: int = 0,
        weight_init: torch.Tensor | None = None,
        config: Mapping[str, Any] | None = None,
        storage: Any = None,
        optimize_for_training: bool = True,
        device: Any = None,
        mode: str = "sum",
    ) -> None:
        if layer_type is LayerType.HostLayer:
            raise ValueError("NVEmbeddingBag does not support LayerType.HostLayer; use NVEmbedding")
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode has to be one of sum, mean or max, got {mode!r}")
        super().__init__(
            num_embeddings, embedding_size, data_type, layer_type, gpu_cache_size, weight_init,
            config, storage, optimize_for_training, device,
        )  # fmt: skip
        self.mode = mode

    @runs_eagerly
    def forward(
        self,
        keys: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        distinct, inverse = self._distinct(keys)
        self._begin_lookup()
        (rows,) = TablesLookup.apply(self._anchor, [self], distinct)
        return self._pool(rows, inverse, offsets, per_sample_weights)

    def exported_forward(
        self,
        keys: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One row per key (no distinct pass: its size would depend on the data), pooled."""
        rows = self._exported_rows(keys)
        index = torch.arange(keys.numel(), device=rows.device).view(keys.shape)
        return pool_indexed(rows, index, offsets, self.mode, per_sample_weights)

    def _distinct(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``keys`` checked: their distinct keys and each key's index among them."""
        flat = self._keys(keys)
        if self._device_table is not None:  # on the GPU, where the keys are
            distinct, inverse = torch.unique(flat, return_inverse=True)
        else:
            distinct, inverse = unique_keys(flat)
        return distinct, inverse.view(keys.shape)

    def _pool(
        self,
        rows: torch.Tensor,
        indices: torch.Tensor,
        offsets: torch.Tensor | None,
        per_sample_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        """Bags of ``rows[indices]`` pooled (``rows``: the lookup's distinct keys' rows);
        torch's backward sums each row's gradient. The lookup counted, logged when due."""
        return pool_indexed(self._end_lookup(rows), indices, offsets, self.mode, per_sample_weights)
