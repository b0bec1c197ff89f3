"""``recstore.nve``: NVIDIA's embedding-cache layers (NVEmbedding, NVEmbeddingBag) over RecStore."""

from recstore.client.nve import *  # noqa: F403  (the names its __all__ lists)
from recstore.client.nve import __all__ as __all__
