"""Who registered each node (only the provisioner's nodes are dialled or scraped), and
server-side dashboard sessions (logout revokes them; each carries its CSRF token).

Revision ID: 0002_node_registrar_sessions
Revises: 0001_initial
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from recstore.admin.models import UTCDateTime

revision = "0002_node_registrar_sessions"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows keep NULL: nobody can tell who registered them, so they are not trusted.
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("registered_by", sa.String(255), nullable=True))
        batch.add_column(sa.Column("registered_role", sa.String(16), nullable=True))

    op.create_table(
        "dashboard_sessions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("session_hash", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )
    op.create_index(
        "ix_dashboard_sessions_session_hash", "dashboard_sessions", ["session_hash"], unique=True
    )
    op.create_index("ix_dashboard_sessions_token_hash", "dashboard_sessions", ["token_hash"])
    op.create_index("ix_dashboard_sessions_expires_at", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_table("dashboard_sessions")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("registered_role")
        batch.drop_column("registered_by")
