"""Alembic migrations up and down on both databases; the app refuses readiness off head."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import sqlalchemy as sa
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import inspect

from recstore.admin import Settings, create_app, db, views
from recstore.admin.models import Base, CheckpointRecord, TableRecord, UTCDateTime
from recstore.core import SlotMap, TableSpec

TABLES = {"tables", "nodes", "checkpoints", "events", "tokens", "dashboard_sessions", "pools"}


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


def test_stored_checkpoints_take_the_one_shape(db_url: str) -> None:
    """0003: a bare final checkpoint id and the local provisioner's {id, checkpoints, at}
    become the status's checkpoint shape, in tables and in checkpoint records; anything
    else is dropped. Every table then serves a status its model accepts."""
    legacy_local = {
        "id": 4,
        "at": "2026-01-01T00:00:00+00:00",
        "checkpoints": [
            {"endpoint": "127.0.0.1:5001", "checkpointId": "request-4", "rows": 7},
            {"endpoint": "127.0.0.1:6001", "checkpointId": "request-4", "rows": 5},
        ],
    }
    stored = {
        "bare": "final-20260101T000000Z",
        "local": legacy_local,
        "odd": {"path": "/data/ckpt/3"},
        "none": None,
    }
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    tables = sa.table(
        "tables", *(sa.column(c) for c in ("id", "name", "generation", "resource_version",
                                          "phase", "created_by")),
        *(sa.column(c, sa.JSON()) for c in ("spec", "conditions", "status_shards", "slot_map",
                                           "last_checkpoint")),
        sa.column("created_at", UTCDateTime()), sa.column("updated_at", UTCDateTime()),
    )  # fmt: skip
    records = sa.table(
        "checkpoints", sa.column("id"), sa.column("table_id"), sa.column("state"),
        sa.column("requested_by"), sa.column("requested_at", UTCDateTime()),
        sa.column("detail", sa.JSON()),
    )  # fmt: skip
    spec = TableSpec(name="t", num_embeddings=10, embedding_dim=2).model_dump(mode="json")
    engine = db.make_engine(db_url)
    try:
        db.upgrade(engine, "0002_node_registrar_sessions")
        with engine.begin() as conn:
            for i, (name, last) in enumerate(stored.items(), start=1):
                conn.execute(tables.insert().values(
                    id=i, name=name, generation=1, resource_version=1, phase="Ready",
                    created_by="test", spec={**spec, "name": name}, conditions=[],
                    status_shards=[], slot_map=SlotMap.initial(1).to_dict(),
                    last_checkpoint=last, created_at=now, updated_at=now,
                ))  # fmt: skip
            conn.execute(records.insert().values(
                id=4, table_id=2, state="Completed", requested_by="test", requested_at=now,
                detail={"note": "kept", "result": legacy_local},
            ))  # fmt: skip
        db.upgrade(engine)
        with db.make_sessionmaker(engine)() as session:
            by_name = {t.name: t for t in session.scalars(sa.select(TableRecord))}
            served = {name: views.status_of(t).to_wire() for name, t in by_name.items()}
            record = session.get(CheckpointRecord, 4)
            assert record is not None
            detail = record.detail
    finally:
        engine.dispose()
    shards = [
        {"index": 0, "endpoint": "127.0.0.1:5001", "rows": 7, "bytes": None, "error": None},
        {"index": 1, "endpoint": "127.0.0.1:6001", "rows": 5, "bytes": None, "error": None},
    ]
    assert served["bare"]["lastCheckpoint"] == {
        "id": "final-20260101T000000Z", "requestId": None, "state": "Completed",
        "message": None, "at": None, "shards": [],
    }  # fmt: skip
    local = {"id": "request-4", "requestId": 4, "state": "Completed", "message": None,
             "at": "2026-01-01T00:00:00+00:00", "shards": shards}  # fmt: skip
    assert served["local"]["lastCheckpoint"] == local
    assert served["odd"]["lastCheckpoint"] is None and served["none"]["lastCheckpoint"] is None
    assert all(status["checkpointRequest"] is None for status in served.values())
    assert detail == {"note": "kept", "result": local}
