"""``recstore.nn``: torch embedding modules whose weights live in RecStore.

``optimizer_state(model)``: within it, ``model.state_dict()`` also carries each
table's optimizer state (``optimizer.sum``, ``optimizer.exp_avg``, ...), and
``load_state_dict`` requires it.
"""

from recstore.client.collection import EmbeddingBagCollection, EmbeddingBagConfig
from recstore.client.nn import Embedding, EmbeddingBag
from recstore.client.state import optimizer_state

__all__ = [
    "Embedding",
    "EmbeddingBag",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "optimizer_state",
]
