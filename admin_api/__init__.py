"""RecStore admin API: the table catalogue, nodes, checkpoints, tokens, audit log and dashboard.

``create_app(settings)`` builds the FastAPI application; ``recstore admin`` serves it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recstore.admin.main import create_app as create_app
    from recstore.admin.settings import Settings as Settings


def __getattr__(name: str) -> Any:
    # Lazy, so importing a submodule (e.g. the alembic env) does not build the whole app.
    if name == "create_app":
        from recstore.admin.main import create_app

        return create_app
    if name == "Settings":
        from recstore.admin.settings import Settings

        return Settings
    raise AttributeError(f"module 'recstore.admin' has no attribute {name!r}")


__all__ = ["Settings", "create_app"]
