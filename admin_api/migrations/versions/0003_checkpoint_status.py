"""One checkpoint shape in a table's status: ``lastCheckpoint`` and the new
``checkpointRequest`` are both ``{id, requestId, state, message, at, shards}``.

Rows written before held a bare checkpoint id (the operator's final checkpoint) or the
local provisioner's ``{id, checkpoints, at}``; both become the new shape, in the table's
``last_checkpoint`` and in a completed checkpoint record's ``detail.result``. A value of
any other shape (nothing reported it) is dropped.

Revision ID: 0003_checkpoint_status
Revises: 0002_node_registrar_sessions
Create Date: 2026-12-07
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0003_checkpoint_status"
down_revision = "0002_node_registrar_sessions"
branch_labels = None
depends_on = None

_TABLES = sa.table("tables", sa.column("id"), sa.column("last_checkpoint", sa.JSON()))
_RECORDS = sa.table("checkpoints", sa.column("id"), sa.column("detail", sa.JSON()))
_SHAPE = {"id", "requestId", "state", "message", "at", "shards"}


def upgrade() -> None:
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("checkpoint_request", sa.JSON(), nullable=True))
    bind = op.get_bind()
    for row in bind.execute(sa.select(_TABLES.c.id, _TABLES.c.last_checkpoint)).all():
        if row.last_checkpoint is not None:
            bind.execute(
                _TABLES.update()
                .where(_TABLES.c.id == row.id)
                .values(last_checkpoint=_checkpoint(row.last_checkpoint))
            )
    for row in bind.execute(sa.select(_RECORDS.c.id, _RECORDS.c.detail)).all():
        detail = row.detail
        if isinstance(detail, dict) and detail.get("result") is not None:
            result = _checkpoint(detail["result"])
            bind.execute(
                _RECORDS.update()
                .where(_RECORDS.c.id == row.id)
                .values(detail={**detail, "result": result})
            )


def _checkpoint(value: Any) -> dict[str, Any] | None:
    """A stored checkpoint in the one shape (as it was in 0003), None when it has none."""
    if isinstance(value, str) and value:
        return {"id": value, "requestId": None, "state": "Completed", "message": None,
                "at": None, "shards": []}  # fmt: skip
    if not isinstance(value, dict):
        return None
    if set(value) <= _SHAPE and {"id", "state"} <= set(value):
        return value
    request = value.get("id")
    if isinstance(request, int) and isinstance(value.get("checkpoints"), list):
        shards = [
            {"index": index, "endpoint": saved.get("endpoint"), "rows": saved.get("rows"),
             "bytes": None, "error": None}
            for index, saved in enumerate(value["checkpoints"])
            if isinstance(saved, dict)
        ]  # fmt: skip
        return {"id": f"request-{request}", "requestId": request, "state": "Completed",
                "message": None, "at": value.get("at"), "shards": shards}  # fmt: skip
    return None


def downgrade() -> None:
    # the converted checkpoints stay: the earlier code kept them as opaque JSON
    with op.batch_alter_table("tables") as batch:
        batch.drop_column("checkpoint_request")
