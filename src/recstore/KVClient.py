"""``from recstore.KVClient import RecStoreClient``: the import path of the documented example."""

from recstore.client import RecStoreClient

__all__ = ["RecStoreClient"]
