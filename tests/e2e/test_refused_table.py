"""A table no node can host (a GPU table on a machine without one) fails at once, with its reason.

The nodes refuse it with an expected status (FAILED_PRECONDITION, no
traceback), the table goes to Failed with the node's reason in its Ready
condition (REST, `recstore get table`, the dashboard), and the provisioner
asks again only after a growing back-off instead of at every poll.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from recstore import _native
from recstore.cli import app
from recstore.local.platform import LocalPlatform
from recstore.local.shard_client import ShardClient, TableRefused
from recstore.local.table import RetryBackoff

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize(
    ("failures", "succeeded", "at", "due"),
    [
        ([], False, 0.0, True),  # never refused: ask at once
        ([0.0], False, 0.5, False),  # the first wait is 1 s
        ([0.0], False, 1.0, True),
        ([0.0, 1.0], False, 2.9, False),  # then 2 s
        ([0.0, 1.0], False, 3.0, True),
        ([0.0, 1.0, 3.0], True, 3.0, True),  # a success resets it
    ],
)
def test_retry_backoff_doubles_from_one_second(
    failures: list[float], succeeded: bool, at: float, due: bool
) -> None:
    backoff = RetryBackoff()
    for when in failures:
        backoff.failed(when)
    if succeeded:
        backoff.succeeded()
    assert backoff.due(at) is due


def test_retry_backoff_is_capped() -> None:
    backoff = RetryBackoff()  # 1 s doubling to a minute
    for when in range(20):
        backoff.failed(float(when))
    assert backoff.delay == 60.0


class Clock:
    """The provisioner's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.skipif(_native.cuda_available(), reason="a GPU is present: the table would be hosted")
def test_a_gpu_table_without_a_gpu_fails_with_the_reason_and_backs_off(
    platform: LocalPlatform, api: Any, helpers: SimpleNamespace, monkeypatch, caplog
) -> None:
    clock = Clock()
    monkeypatch.setattr(platform.provisioner, "clock", clock)
    attempts: list[str] = []  # every CreateTable the provisioner sends
    refused: list[str] = []  # those a serving node answered with a refusal
    ensure = ShardClient.ensure_table

    def counted(self: ShardClient, spec: Any, slot_map: Any = None) -> bool:
        attempts.append(self.endpoint)
        try:
            return ensure(self, spec, slot_map)
        except TableRefused:
            refused.append(self.endpoint)
            raise

    monkeypatch.setattr(ShardClient, "ensure_table", counted)
    caplog.set_level("ERROR", logger="recstore.local.table_status")
    api.create_table(
        {"name": "on_gpu", "numEmbeddings": 1000, "embeddingDim": 8, "shards": 2,
         "storage": "gpu"}
    )  # fmt: skip
    table = helpers.wait_for(
        lambda: (t := api.table("on_gpu"))["status"].get("phase") == "Failed" and t,
        90, "table on_gpu Failed",
    )  # fmt: skip
    ready = {c["type"]: c for c in table["status"]["conditions"]}["Ready"]
    assert ready["reason"] == "NodeRefused"
    assert "stored on a GPU (storage: gpu), but this node cannot use one" in ready["message"]
    assert "storage: host" in ready["message"]

    first, first_refused = len(attempts), len(refused)
    for _ in range(20):  # polls while the back-off runs: nothing is asked again
        platform.provisioner.report_now()
    assert len(attempts) == first
    # The first back-off (1 s) is over: asked once more, refused again. (A node still
    # starting answers nothing, which is no refusal: the next shard is asked then.)
    clock.now += 1.0
    platform.provisioner.report_now()
    assert len(refused) == first_refused + 1
    asked = len(attempts)
    clock.now += 1.0  # the next back-off is 2 s: nothing yet
    platform.provisioner.report_now()
    assert len(attempts) == asked
    refusals = [r for r in caplog.records if "refused it" in r.getMessage()]
    assert len(refusals) == 1  # said once

    with httpx.Client(base_url=platform.url) as browser:  # the dashboard, signed in
        login = browser.post("/ui/login", data={"token": platform.token})
        assert login.status_code == 303 and login.headers["location"] == "/ui/"
        page = browser.get("/ui/tables/on_gpu")
    assert page.status_code == 200 and "NodeRefused" in page.text
    assert "but this node cannot use one" in page.text
    shown = CliRunner().invoke(
        app, ["get", "table", "on_gpu", "--admin-url", platform.url, "--token", platform.token],
        env={"COLUMNS": "300"},
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "Ready=False (NodeRefused)" in shown.output and "storage: gpu" in shown.output
    for shard in range(2):  # the nodes answered with an expected status: no traceback
        log = (platform.state_dir / "tables" / "on_gpu" / f"shard-{shard}.log").read_text()
        assert "unexpected failure" not in log and "Traceback" not in log
