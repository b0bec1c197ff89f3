"""The NV Embedding Cache layer options: layer types, the ``config`` keys, device rules.

Every rule of the reference API that can be checked before a table is touched
is checked here, so a rejected layer changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from recstore.client.host_cache import POLICIES
from recstore.client.nve.freshness import check_interval

#: seconds between two reports of a layer's host cache to its table's nodes
DEFAULT_REPORT_INTERVAL_S = 10


class LayerType(Enum):
    """Where a layer's rows live (the reference's ``nve_layers.LayerType``)."""

    GPULayer = "GPULayer"  # GPU memory
    LinearUVM = "LinearUVM"  # host memory with a GPU cache
    Hierarchical = "Hierarchical"  # a remote parameter server (RecStore), host (+GPU) cache
    HostLayer = "HostLayer"  # host memory, inference only


#: layer types whose rows or cache live on a GPU whatever the device argument says
NEEDS_GPU = (LayerType.GPULayer, LayerType.LinearUVM)

#: config keys tuning the reference's GPU table kernels: accepted (ints), no effect
#: (the engine's kernels take no tuning)
KERNEL_KEYS = ("kernel_mode", "kernel_mode_value_1", "kernel_mode_value_2")
#: every config key, with what it does
CONFIG_KEYS = {
    "logging_interval": "log a line with the cache's counters every N lookups (0: never)",
    "max_modify_size": "at most this many rows per cache insert and per gradient update",
    "host_cache_size": "bytes of host memory for the cache in front of the table (0: none)",
    "max_staleness_steps": "training: a cached row serves at most this many steps",
    "cache_policy": f"host cache eviction: one of {POLICIES}",
    "version_check_interval": "inference: seconds a node's confirmed table version spares it "
    "a round trip when all its keys hit (0: every lookup asks every node; recstore.nve.freshness)",
    "cache_report_interval": "seconds between reports of the host cache's counters to the "
    f"table's nodes (default {DEFAULT_REPORT_INTERVAL_S}; 0: only on report_cache_stats())",
    **{key: "GPU kernel tuning of the reference: accepted, no effect" for key in KERNEL_KEYS},
}


@dataclass(frozen=True)
class LayerConfig:
    logging_interval: int = 0
    max_modify_size: int | None = None
    host_cache_size: int = 0
    max_staleness_steps: int | None = None
    cache_policy: str = "lfu"
    version_check_interval: float = 0.0
    cache_report_interval: int = DEFAULT_REPORT_INTERVAL_S
    kernel: tuple[int, int, int] = (0, 0, 0)


def _non_negative_int(key: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"config[{key!r}] must be an integer >= {minimum}, got {value!r}")
    return value


def modify_chunks(count: int, max_modify_size: int | None) -> list[slice]:
    """A gradient of ``count`` rows as the table updates it, in order: ``max_modify_size``
    rows per update (all at once when unset)."""
    step = max_modify_size or max(1, count)
    return [slice(start, start + step) for start in range(0, count, step)]


def parse_config(config: Mapping[str, Any] | None) -> LayerConfig:
    """The layer's ``config`` dict, checked: unknown keys and bad values are errors."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; known keys: {sorted(CONFIG_KEYS)}")
    policy = config.get("cache_policy", "lfu")
    if policy not in POLICIES:
        raise ValueError(f"config['cache_policy'] must be one of {POLICIES}, got {policy!r}")
    interval = check_interval(
        config.get("version_check_interval", 0.0), "config['version_check_interval']"
    )
    modify = config.get("max_modify_size")
    staleness = config.get("max_staleness_steps")
    return LayerConfig(
        logging_interval=_non_negative_int("logging_interval", config.get("logging_interval", 0)),
        max_modify_size=None if modify is None else _non_negative_int("max_modify_size", modify, 1),
        host_cache_size=_non_negative_int("host_cache_size", config.get("host_cache_size", 0)),
        max_staleness_steps=None
        if staleness is None
        else _non_negative_int("max_staleness_steps", staleness),
        cache_policy=policy,
        version_check_interval=interval,
        cache_report_interval=_non_negative_int(
            "cache_report_interval", config.get("cache_report_interval", DEFAULT_REPORT_INTERVAL_S)
        ),
        kernel=tuple(_non_negative_int(k, config.get(k, 0)) for k in KERNEL_KEYS),  # type: ignore[arg-type]
    )


def resolve_device(layer_type: LayerType, device: Any, gpu_cache_size: int) -> torch.device:
    """The layer's device: keys come in and rows go out there.

    The reference defaults to the current CUDA device. Without a GPU, the types
    that need one (and a GPU cache of any size) are refused, naming what is
    missing; ``HostLayer`` then defaults to the CPU.
    """
    cuda = torch.cuda.is_available()
    if device is None:
        if cuda:
            device = torch.device("cuda", torch.cuda.current_device())
        elif layer_type is LayerType.HostLayer or (
            layer_type is LayerType.Hierarchical and not gpu_cache_size
        ):
            device = torch.device("cpu")
    resolved = torch.device(device) if device is not None else None
    wants_gpu = layer_type in NEEDS_GPU or gpu_cache_size > 0
    if wants_gpu and not cuda:
        what = f"LayerType.{layer_type.name}"
        if gpu_cache_size > 0 and layer_type not in NEEDS_GPU:
            what += f" with gpu_cache_size={gpu_cache_size}"
        hint = (
            "; on a CPU-only machine use LayerType.HostLayer (inference) or "
            "LayerType.Hierarchical with gpu_cache_size=0 and config={'host_cache_size': ...}"
        )
        raise RuntimeError(
            f"{what} needs a CUDA GPU, and torch.cuda.is_available() is False "
            f"(no GPU or no CUDA driver on this machine){hint}"
        )
    assert resolved is not None
    if wants_gpu and resolved.type != "cuda":
        raise ValueError(
            f"LayerType.{layer_type.name} with a GPU cache keeps its rows on a CUDA device, "
            f"got device={resolved}"
        )
    return resolved
