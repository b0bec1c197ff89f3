"""The RecStore SDK used inside training jobs.

``RecStoreClient`` is the documented KVClient API (pull, push, update,
prefetch, ...) over the native store in this process or sharded PS nodes;
``Embedding`` and ``EmbeddingBag`` are torch modules whose weights live in
RecStore and whose optimizer runs there.
"""

from recstore.client.client import RecStoreClient
from recstore.client.errors import BackendError, TableNotInitialized, TableShapeMismatch
from recstore.client.nn import Embedding, EmbeddingBag

__all__ = [
    "BackendError",
    "Embedding",
    "EmbeddingBag",
    "RecStoreClient",
    "TableNotInitialized",
    "TableShapeMismatch",
]
