"""Fixtures: a SQLite file and a real PostgreSQL server, an app per test, tokens per role."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from recstore.admin import Settings, create_app
from recstore.local.ports import free_port

ADMIN_SECRET = "bootstrap-admin-secret-for-tests"
PROVISIONER_SECRET = "bootstrap-provisioner-secret-for-tests"
_database_ids = itertools.count()

PG_BIN = Path(os.environ.get("RECSTORE_PG_BIN", "/usr/lib/postgresql/15/bin"))


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        conninfo = f"host={self.host} port={self.port} user=postgres dbname=postgres"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def available() -> bool:
    return (PG_BIN / "initdb").exists() and (PG_BIN / "pg_ctl").exists()


def _as_owner(command: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *command] if owner else command


@contextmanager
def running_server() -> Iterator[PgServer]:
    """initdb + pg_ctl start in a temporary folder; stopped and removed on exit.

    initdb refuses to run as root, so as root the cluster belongs to ``postgres``.
    """
    owner = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="recstore-pg-"))
    data = root / "data"
    data.mkdir()
    if owner:
        shutil.chown(root, owner)
        shutil.chown(data, owner)
    port = free_port()  # PostgreSQL cannot listen on port 0
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    subprocess.run(
        _as_owner(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            owner,
        ),
        check=True,
        capture_output=True,
        env=env,
    )
    options = f"-k {root} -p {port} -h 127.0.0.1 -c fsync=off -c full_page_writes=off"
    subprocess.run(
        _as_owner(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(root / "log"),
                "-w",
                "start",
            ],
            owner,
        ),
        check=True,
        capture_output=True,
        env=env,
    )
    try:
        yield PgServer("127.0.0.1", port)
    finally:
        subprocess.run(
            _as_owner(
                [str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], owner
            ),
            capture_output=True,
            env=env,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    if not available():
        # `make test` installs the server (scripts/install_system_deps.sh); CI must not skip.
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries not installed")
        pytest.skip("PostgreSQL server binaries not installed")
    with running_server() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'admin.db'}"
    server: PgServer = request.getfixturevalue("pg_server")
    return server.create_database(f"admin_{next(_database_ids)}")


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        bootstrap_token=SecretStr(ADMIN_SECRET),
        provisioner_token=SecretStr(PROVISIONER_SECRET),
    )


@pytest.fixture
def app(settings: Settings) -> Iterator[FastAPI]:
    application = create_app(settings)
    yield application
    application.state.context.engine.dispose()


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def tokens(client: TestClient) -> dict[str, str]:
    """A secret per role, created through the API by the bootstrap admin."""
    secrets = {}
    for role in ("viewer", "editor", "admin", "provisioner"):
        r = client.post(
            "/api/v1/tokens",
            json={"name": f"{role}-user", "role": role},
            headers=bearer(ADMIN_SECRET),
        )
        assert r.status_code == 201, r.text
        secrets[role] = r.json()["token"]
    return secrets


@pytest.fixture
def as_role(tokens: dict[str, str]) -> Callable[[str], dict[str, str]]:
    return lambda role: bearer(tokens[role])


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return bearer(ADMIN_SECRET)


@pytest.fixture
def provisioner_headers() -> dict[str, str]:
    """The provisioner identity: the only one that registers nodes and writes shard status."""
    return bearer(PROVISIONER_SECRET)


def dashboard_login(client: TestClient, token: str) -> str:
    """Log in through the dashboard's form; returns the session's CSRF token."""
    r = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    page = client.get("/ui/").text
    marker = 'name="csrf_token" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]
