"""recstore.store: the Python facade over the native store engine.

``Table`` holds one shard of one embedding table (numpy or torch buffers in
and out, no copies on the host); ``Store`` is the per-process registry of
tables the PS node and the SDK's local backend share.
"""

from recstore.store.registry import Store
from recstore.store.table import Chunk, Table

__all__ = ["Chunk", "Store", "Table"]
