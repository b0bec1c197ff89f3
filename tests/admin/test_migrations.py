"""Alembic migrations up and down on both databases; the app refuses readiness off head."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import inspect

from recstore.admin import Settings, create_app, db
from recstore.admin.models import Base

TABLES = {"tables", "nodes", "checkpoints", "events", "tokens", "dashboard_sessions"}


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    engine = db.make_engine(db_url)
    try:
        assert db.current_revision(engine) is None
        db.upgrade(engine)
        assert db.current_revision(engine) == db.head_revision()
        assert set(inspect(engine).get_table_names()) >= TABLES
        db.downgrade(engine, "base")
        assert db.current_revision(engine) is None
        assert not TABLES & set(inspect(engine).get_table_names())
        db.upgrade(engine)
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()


def test_migrated_schema_matches_the_models(db_url: str) -> None:
    """The migration creates every column and index the ORM models declare."""
    engine = db.make_engine(db_url)
    try:
        db.upgrade(engine)
        inspector = inspect(engine)
        for table in Base.metadata.sorted_tables:
            columns = {c["name"]: c for c in inspector.get_columns(table.name)}
            assert set(columns) == {c.name for c in table.columns}, table.name
            for column in table.columns:
                assert columns[column.name]["nullable"] == column.nullable, (table.name, column)
            indexed = {tuple(i["column_names"]) for i in inspector.get_indexes(table.name)}
            indexed |= {
                tuple(u["column_names"]) for u in inspector.get_unique_constraints(table.name)
            }
            for index in table.indexes:
                assert tuple(c.name for c in index.columns) in indexed, (table.name, index.name)
    finally:
        engine.dispose()


def test_app_start_applies_migrations_and_data_survives_restart(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'a.db'}", bootstrap_token=SecretStr("s")
    )
    headers = {"Authorization": "Bearer s"}
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").json()["schema"] == db.head_revision()
        spec = {"name": "kept", "numEmbeddings": 3, "embeddingDim": 2}
        assert client.post("/api/v1/tables", json=spec, headers=headers).status_code == 201
    with TestClient(create_app(settings)) as client:  # second start: upgrade is a no-op
        assert client.get("/api/v1/tables/kept", headers=headers).status_code == 200


def test_readyz_is_503_when_the_schema_is_behind(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}", migrate_on_start=False)
    with TestClient(create_app(settings)) as client:
        r = client.get("/readyz")
        assert r.status_code == 503 and "schema" in r.json()["reason"]
        assert client.get("/healthz").status_code == 200
