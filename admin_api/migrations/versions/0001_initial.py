"""Initial catalogue: tables, nodes, checkpoints, events, tokens.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from recstore.admin.models import UTCDateTime

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tables",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("resource_version", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("conditions", sa.JSON(), nullable=False),
        sa.Column("observed_generation", sa.Integer(), nullable=True),
        sa.Column("status_shards", sa.JSON(), nullable=False),
        sa.Column("slot_map", sa.JSON(), nullable=False),
        sa.Column("last_checkpoint", sa.JSON(), nullable=True),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_tables_name", "tables", ["name"], unique=True)
    op.create_index("ix_tables_phase", "tables", ["phase"])

    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "table_id", sa.Integer(), sa.ForeignKey("tables.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(255), nullable=False),
        sa.Column("metrics_endpoint", sa.String(255), nullable=True),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("registered_at", UTCDateTime(), nullable=False),
        sa.Column("last_heartbeat", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("table_id", "shard_index", name="uq_nodes_table_shard"),
    )
    op.create_index("ix_nodes_table_id", "nodes", ["table_id"])

    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "table_id", sa.Integer(), sa.ForeignKey("tables.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("requested_by", sa.String(255), nullable=False),
        sa.Column("requested_at", UTCDateTime(), nullable=False),
        sa.Column("completed_at", UTCDateTime(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
    )
    op.create_index("ix_checkpoints_table_id", "checkpoints", ["table_id"])
    op.create_index("ix_checkpoints_state", "checkpoints", ["state"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("resource_type", sa.String(32), nullable=False),
        sa.Column("resource_name", sa.String(128), nullable=False),
        sa.Column("table_name", sa.String(63), nullable=True),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
    )
    op.create_index("ix_events_at", "events", ["at"])
    op.create_index("ix_events_actor", "events", ["actor"])
    op.create_index("ix_events_action", "events", ["action"])
    op.create_index("ix_events_table_name", "events", ["table_name"])

    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.Column("last_used_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_tokens_token_hash", "tokens", ["token_hash"], unique=True)


def downgrade() -> None:
    op.drop_table("tokens")
    op.drop_table("events")
    op.drop_table("checkpoints")
    op.drop_table("nodes")
    op.drop_table("tables")
