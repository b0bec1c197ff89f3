"""The RecStore SDK used inside training jobs.

``RecStoreClient`` is the documented KVClient API (pull, push, update,
prefetch, ...) over the native store in this process or sharded PS nodes;
``Embedding`` and ``EmbeddingBag`` are torch modules whose weights live in
RecStore and whose optimizer runs there; ``EmbeddingBagCollection`` looks up
several bags with one request per PS node.
"""

from recstore.client.backends.base import RowChunk
from recstore.client.client import RecStoreClient
from recstore.client.collection import EmbeddingBagCollection, EmbeddingBagConfig
from recstore.client.errors import (
    BackendError,
    TableNotInitialized,
    TableShapeMismatch,
    WriteAppliedNotDurable,
    WriteNotApplied,
)
from recstore.client.nn import Embedding, EmbeddingBag

__all__ = [
    "BackendError",
    "Embedding",
    "EmbeddingBag",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "RecStoreClient",
    "RowChunk",
    "TableNotInitialized",
    "TableShapeMismatch",
    "WriteAppliedNotDurable",
    "WriteNotApplied",
]
