"""``recstore admin``: options reach the settings, and the served app works; ``recstore token``."""

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


def test_token_create_mints_a_provisioner_token(
    app: Any, admin_headers: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``recstore token create NAME --role provisioner`` prints a secret that may write status."""
    from recstore.cli import api_client
    from recstore.cli import app as cli

    def in_process(*, base_url: str, headers: dict[str, str], **_: Any) -> TestClient:
        return TestClient(app, base_url=base_url, headers=headers)  # timeout, verify: unused

    monkeypatch.setattr(api_client.httpx, "Client", in_process)
    admin = admin_headers["Authorization"].split()[1]
    common = ["--admin-url", "http://testserver", "--token", admin, "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(
        cli, ["token", "create", "operator", "--role", "provisioner", *common]
    )
    assert result.exit_code == 0, result.output
    secret = result.stdout.strip().splitlines()[0]
    refused = CliRunner().invoke(cli, ["token", "create", "x", "--role", "root", *common])
    assert refused.exit_code == 1 and "--role must be one of" in refused.output
    with TestClient(app) as client:
        spec = {"name": "t", "numEmbeddings": 1, "embeddingDim": 1}
        assert client.post("/api/v1/tables", json=spec, headers=admin_headers).status_code == 201
        status = client.put(
            "/api/v1/tables/t/status",
            json={"phase": "Ready"},
            headers={"Authorization": f"Bearer {secret}"},
        )
        assert status.status_code == 200, status.text
        listed = client.get("/api/v1/tokens", headers=admin_headers).json()["items"]
        assert [(t["name"], t["role"]) for t in listed] == [("operator", "provisioner")]


def test_apply_get_and_delete_a_pool_and_its_table(
    app: Any, admin_headers: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``recstore apply -f`` of the example pool and a table on it (the pool first), ``get
    pools``, ``get tables`` naming the pool, a re-apply unchanged, and deletion."""
    from recstore.cli import api_client
    from recstore.cli import app as cli

    def in_process(*, base_url: str, headers: dict[str, str], **_: Any) -> TestClient:
        return TestClient(app, base_url=base_url, headers=headers)

    monkeypatch.setattr(api_client.httpx, "Client", in_process)
    monkeypatch.setenv("COLUMNS", "200")
    examples = Path(__file__).resolve().parents[2] / "examples" / "tables" / "pool"
    both = tmp_path / "both.yaml"  # the table before its pool: apply creates the pool first
    both.write_text((examples / "criteo-c1.yaml").read_text() + "---\n"
                    + (examples / "criteo-pool.yaml").read_text())  # fmt: skip
    admin = admin_headers["Authorization"].split()[1]
    common = ["--admin-url", "http://testserver", "--token", admin, "--state-dir", str(tmp_path)]
    applied = CliRunner().invoke(cli, ["apply", "-f", str(both), *common])
    assert applied.exit_code == 0, applied.output
    assert applied.output.splitlines() == ["embeddingpool/criteo created",
                                           "embeddingtable/criteo-c1 created"]  # fmt: skip
    again = CliRunner().invoke(cli, ["apply", "-f", str(both), *common])
    assert "embeddingtable/criteo-c1 unchanged" in again.output, again.output
    pools = CliRunner().invoke(cli, ["get", "pools", *common])
    assert pools.exit_code == 0 and "criteo" in pools.output and "0/2" in pools.output
    tables = CliRunner().invoke(cli, ["get", "tables", *common])
    assert "criteo-c1" in tables.output and "criteo" in tables.output.split("criteo-c1")[1]
    refused = CliRunner().invoke(cli, ["delete", "pool", "criteo", *common])
    assert refused.exit_code == 1 and "still holds tables criteo-c1" in refused.output
    deleted = CliRunner().invoke(cli, ["delete", "-f", str(both), *common])
    assert deleted.exit_code == 0, deleted.output
    assert deleted.output.splitlines() == ["embeddingtable/criteo-c1 deleted",
                                           "embeddingpool/criteo deleted"]  # fmt: skip
