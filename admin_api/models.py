"""Catalogue tables (SQLAlchemy 2 typed ORM); the alembic migrations create them.

Every row that users edit concurrently carries ``resource_version`` as the
mapper's version column, so a stale write fails in the database itself
(``UPDATE ... WHERE resource_version = :seen``) even when two requests race.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Integer,
    String,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from recstore.admin.security import Role


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime,
        dict[str, Any]: JSON,
        list[Any]: JSON,
    }


class TableRecord(Base):
    __tablename__ = "tables"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True, index=True)
    #: The TableSpec in its snake_case JSON form.
    spec: Mapped[dict[str, Any]]
    #: The EmbeddingPool whose nodes hold the table (NULL: a fleet of its own).
    pool: Mapped[str | None] = mapped_column(String(63), nullable=True, index=True)
    #: Grows with every spec change (what the operator's observedGeneration tracks).
    generation: Mapped[int] = mapped_column(Integer, default=1)
    resource_version: Mapped[int] = mapped_column(Integer, nullable=False)
    phase: Mapped[str] = mapped_column(String(32), default="Pending", index=True)
    conditions: Mapped[list[Any]] = mapped_column(JSON, default=list)
    observed_generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: Shards as the operator or provisioner reported them: [{index, endpoint, ready}].
    status_shards: Mapped[list[Any]] = mapped_column(JSON, default=list)
    #: The slot map the running shards serve ({epoch, ranges}).
    slot_map: Mapped[dict[str, Any]]
    #: The newest checkpoint every shard wrote, and the newest one asked for on demand,
    #: as reported (``recstore.core.checkpoint_status.TableCheckpoint``, camelCase).
    last_checkpoint: Mapped[Any] = mapped_column(JSON, nullable=True)
    checkpoint_request: Mapped[Any] = mapped_column(JSON, nullable=True)
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    nodes: Mapped[list[NodeRecord]] = relationship(
        back_populates="table", cascade="all, delete-orphan", order_by="NodeRecord.shard_index"
    )
    checkpoints: Mapped[list[CheckpointRecord]] = relationship(
        back_populates="table", cascade="all, delete-orphan"
    )

    __mapper_args__ = {"version_id_col": resource_version}  # noqa: RUF012


class PoolRecord(Base):
    """An EmbeddingPool: PS nodes that the tables naming it (``TableRecord.pool``) share."""

    __tablename__ = "pools"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True, index=True)
    #: The PoolSpec in its snake_case JSON form.
    spec: Mapped[dict[str, Any]]
    generation: Mapped[int] = mapped_column(Integer, default=1)
    resource_version: Mapped[int] = mapped_column(Integer, nullable=False)
    phase: Mapped[str] = mapped_column(String(32), default="Pending", index=True)
    #: The PoolStatus as the provisioner reported it (camelCase), NULL before the first.
    status: Mapped[Any] = mapped_column(JSON, nullable=True)
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    __mapper_args__ = {"version_id_col": resource_version}  # noqa: RUF012


class NodeRecord(Base):
    """A PS node serving one shard of a table, as it registered itself."""

    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("table_id", "shard_index", name="uq_nodes_table_shard"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.id", ondelete="CASCADE"), index=True)
    shard_index: Mapped[int] = mapped_column(Integer)
    endpoint: Mapped[str] = mapped_column(String(255))
    metrics_endpoint: Mapped[str | None] = mapped_column(String(255), nullable=True)
    ready: Mapped[bool] = mapped_column(default=False)
    rows: Mapped[int] = mapped_column(BigInteger, default=0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat: Mapped[datetime | None] = mapped_column(nullable=True)
    #: Who registered the node (audit actor) and with which role; NULL for rows older
    #: than the record, which are trusted for nothing until re-registered.
    registered_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    registered_role: Mapped[str | None] = mapped_column(String(16), nullable=True)

    table: Mapped[TableRecord] = relationship(back_populates="nodes")

    @property
    def provisioned(self) -> bool:
        """Registered by the provisioner identity: its endpoints may be dialled and scraped."""
        return self.registered_role == Role.provisioner.value


class CheckpointRecord(Base):
    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.id", ondelete="CASCADE"), index=True)
    #: Requested -> Running -> Completed or Failed, as the table status reports it
    #: (``recstore.core.checkpoint_status.CheckpointState``).
    state: Mapped[str] = mapped_column(String(32), default="Requested", index=True)
    requested_by: Mapped[str] = mapped_column(String(255))
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    detail: Mapped[Any] = mapped_column(JSON, nullable=True)

    table: Mapped[TableRecord] = relationship(back_populates="checkpoints")


class EventRecord(Base):
    """Audit log: one row per mutation, written in the mutation's own transaction."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(255), index=True)
    action: Mapped[str] = mapped_column(String(64), index=True)
    resource_type: Mapped[str] = mapped_column(String(32))
    resource_name: Mapped[str] = mapped_column(String(128))
    table_name: Mapped[str | None] = mapped_column(String(63), nullable=True, index=True)
    before: Mapped[Any] = mapped_column(JSON, nullable=True)
    after: Mapped[Any] = mapped_column(JSON, nullable=True)


class TokenRecord(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    #: The first characters of the secret, to tell tokens apart in listings.
    prefix: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(nullable=True)


class DashboardSession(Base):
    """A dashboard login: the cookie holds a random secret, this row its digest.

    Logging out deletes the row, so a copied cookie stops working at once. The
    row keeps the digest of the token that logged in and the request resolves
    it again each time, so revoking that token ends its sessions too.
    """

    __tablename__ = "dashboard_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    token_hash: Mapped[str] = mapped_column(String(64), index=True)
    #: Echoed by every form of the session (a hidden field), checked on each POST.
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)
