"""EmbeddingPools: the ``pools`` table, and the pool a table is placed on (``tables.pool``).

Revision ID: 0004_pools
Revises: 0003_checkpoint_status
Create Date: 2027-01-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from recstore.admin.models import UTCDateTime

revision = "0004_pools"
down_revision = "0003_checkpoint_status"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("resource_version", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("status", sa.JSON(), nullable=True),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_pools_name", "pools", ["name"], unique=True)
    op.create_index("ix_pools_phase", "pools", ["phase"])
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("pool", sa.String(63), nullable=True))
        batch.create_index("ix_tables_pool", ["pool"])


def downgrade() -> None:
    with op.batch_alter_table("tables") as batch:
        batch.drop_index("ix_tables_pool")
        batch.drop_column("pool")
    op.drop_index("ix_pools_phase", table_name="pools")
    op.drop_index("ix_pools_name", table_name="pools")
    op.drop_table("pools")
