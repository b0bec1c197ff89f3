"""``recstore admin``: options reach the settings, and the served app works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from recstore.cli.admin import register


def test_admin_command_builds_and_serves_the_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: dict[str, Any] = {}

    def fake_run(app: Any, **kwargs: Any) -> None:  # stands in for the blocking server loop
        served.update(kwargs, app=app)

    import uvicorn

    monkeypatch.setattr(uvicorn, "run", fake_run)
    monkeypatch.setenv("RECSTORE_BOOTSTRAP_TOKEN", "cli-secret")
    cli = typer.Typer()
    register(cli)

    @cli.command("other")
    def other() -> None:  # a second command keeps typer from collapsing to one
        pass

    db = tmp_path / "cli.db"
    result = CliRunner().invoke(
        cli, ["admin", "--db", f"sqlite:///{db}", "--host", "127.0.0.1", "--port", "18080"]
    )
    assert result.exit_code == 0, result.output
    assert served["host"] == "127.0.0.1" and served["port"] == 18080
    assert db.exists()  # migrations ran at start
    with TestClient(served["app"]) as client:
        r = client.get("/api/v1/tables", headers={"Authorization": "Bearer cli-secret"})
        assert r.status_code == 200
    assert "cli-secret" not in result.output


def test_admin_help_lists_the_options() -> None:
    cli = typer.Typer()
    register(cli)

    @cli.command("other")
    def other() -> None:
        pass

    result = CliRunner().invoke(cli, ["admin", "--help"])
    assert result.exit_code == 0
    for option in ("--db", "--host", "--port"):
        assert option in result.output
