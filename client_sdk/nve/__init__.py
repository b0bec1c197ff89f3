"""The NV Embedding Cache layer API (``recstore.nve``) with RecStore as its parameter server."""

from recstore.client.nve.collection import NVEmbeddingBagCollection
from recstore.client.nve.config import CONFIG_KEYS, LayerType
from recstore.client.nve.layers import NVEmbedding, NVEmbeddingBag
from recstore.client.nve.metrics import register_cache_metrics
from recstore.client.nve.storage import DataType_t, HostMemBlock, RemoteTable

__all__ = [
    "CONFIG_KEYS",
    "DataType_t",
    "HostMemBlock",
    "LayerType",
    "NVEmbedding",
    "NVEmbeddingBag",
    "NVEmbeddingBagCollection",
    "RemoteTable",
    "register_cache_metrics",
]
