"""`recstore checkpoint` and `recstore get table` read a checkpoint's outcome from the admin
API: a completed one's rows, a failed one's reason (and exit status 1), the table's last
checkpoint and newest request. A real admin API serves them; the test reports the status
as the provisioner would."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from recstore.admin import Settings, create_app
from recstore.cli import app

ADMIN = "admin-secret-for-cli-checkpoints"
PROVISIONER = "provisioner-secret-for-cli-checkpoints"
SPEC = {"name": "clicks", "numEmbeddings": 100, "embeddingDim": 4, "shards": 2}
SHARDS = [{"index": 0, "rows": 40}, {"index": 1, "rows": 60}]


@pytest.fixture
def admin_url(tmp_path: Path, serve_admin: Any) -> Iterator[str]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'admin.db'}",
        bootstrap_token=SecretStr(ADMIN),
        provisioner_token=SecretStr(PROVISIONER),
    )
    with serve_admin(create_app(settings)) as url:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        httpx.post(f"{url}/api/v1/tables", json=SPEC, headers=headers).raise_for_status()
        yield url


def report(url: str, **checkpoints: Any) -> None:
    httpx.put(
        f"{url}/api/v1/tables/clicks/status",
        json={"phase": "Ready", **checkpoints},
        headers={"Authorization": f"Bearer {PROVISIONER}"},
    ).raise_for_status()


def checkpoint_while_reported(url: str, *states: dict[str, Any]) -> Result:
    """`recstore checkpoint clicks`, the provisioner reporting ``states`` of its request in
    turn (each a checkpointRequest less its ids) once the CLI has asked."""
    outcome: list[Result] = []
    cli = threading.Thread(target=lambda: outcome.append(CliRunner().invoke(
        app, ["checkpoint", "clicks", "--wait", "30", "--admin-url", url, "--token", ADMIN]
    )))  # fmt: skip
    cli.start()
    headers = {"Authorization": f"Bearer {ADMIN}"}
    listed: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while not listed and time.monotonic() < deadline:  # the request the CLI made
        time.sleep(0.05)
        reply = httpx.get(f"{url}/api/v1/tables/clicks/checkpoints", headers=headers).json()
        listed = [c for c in reply["items"] if c["state"] == "Requested"]
    assert listed, "the CLI asked for no checkpoint"
    (asked,) = listed
    for state in states:
        report(url, checkpointRequest={"id": f"request-{asked['id']}", "requestId": asked["id"],
                                       **state})  # fmt: skip
    cli.join(timeout=30)
    (result,) = outcome
    return result


def test_checkpoint_waits_for_completion_and_prints_the_rows(admin_url: str) -> None:
    result = checkpoint_while_reported(
        admin_url, {"state": "Running"}, {"state": "Completed", "shards": SHARDS}
    )
    assert result.exit_code == 0, result.output
    assert "checkpoint 1 of clicks: Completed (100 rows)" in result.output


def test_a_failed_checkpoint_exits_1_with_the_reason(admin_url: str) -> None:
    reason = "shard 1 (127.0.0.1:6001): UNAVAILABLE: disk busy"
    result = checkpoint_while_reported(admin_url, {"state": "Failed", "message": reason})
    assert result.exit_code == 1
    assert f"checkpoint 1 of clicks failed: {reason}" in result.output


def test_get_table_shows_the_last_checkpoint_and_the_newest_request(admin_url: str) -> None:
    done = {"id": "request-1", "requestId": 1, "state": "Completed",
            "at": "2026-01-01T00:00:00Z", "shards": SHARDS}  # fmt: skip
    failed = {"id": "request-2", "requestId": 2, "state": "Failed", "message": "disk busy"}
    report(admin_url, lastCheckpoint=done, checkpointRequest=failed)
    result = CliRunner().invoke(
        app, ["get", "table", "clicks", "--admin-url", admin_url, "--token", ADMIN]
    )
    assert result.exit_code == 0, result.output
    assert "last checkpoint: request-1 at 2026-01-01T00:00:00Z (100 rows)" in result.output
    assert "checkpoint request 2: Failed: disk busy" in result.output
