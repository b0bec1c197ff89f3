"""``recstore.nve``: NVIDIA's embedding-cache layers (NVEmbedding, NVEmbeddingBag) over RecStore."""

from recstore.client.nve import (
    CONFIG_KEYS,
    DataType_t,
    HostMemBlock,
    LayerType,
    NVEmbedding,
    NVEmbeddingBag,
    RemoteTable,
    register_cache_metrics,
)

__all__ = [
    "CONFIG_KEYS",
    "DataType_t",
    "HostMemBlock",
    "LayerType",
    "NVEmbedding",
    "NVEmbeddingBag",
    "RemoteTable",
    "register_cache_metrics",
]
