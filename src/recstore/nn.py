"""``recstore.nn``: torch embedding modules whose weights live in RecStore."""

from recstore.client.collection import EmbeddingBagCollection, EmbeddingBagConfig
from recstore.client.nn import Embedding, EmbeddingBag

__all__ = ["Embedding", "EmbeddingBag", "EmbeddingBagCollection", "EmbeddingBagConfig"]
