"""RecStore: embedding storage for recommendation-model training.

``from recstore import RecStoreClient`` is the one import a trainer needs; it
is resolved lazily so that services importing ``recstore.core`` do not pay for
torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from recstore.client import RecStoreClient as RecStoreClient


def __getattr__(name: str) -> Any:
    if name == "RecStoreClient":
        from recstore.client import RecStoreClient

        return RecStoreClient
    raise AttributeError(f"module 'recstore' has no attribute {name!r}")


__all__ = ["RecStoreClient", "__version__"]
