"""The whole platform on loopback: `recstore up` in-process, real PS node processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from recstore.local.platform import LocalPlatform


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Api:
    """The admin API as the platform's admin token sees it."""

    def __init__(self, platform: LocalPlatform) -> None:
        self.platform = platform
        self.http = httpx.Client(
            base_url=f"{platform.url}/api/v1",
            headers={"Authorization": f"Bearer {platform.token}"},
            verify=platform.tls.client.ssl_context() if platform.tls else True,
            timeout=30,
        )

    def create_table(self, spec: dict[str, Any]) -> None:
        self.http.post("/tables", json=spec).raise_for_status()

    def table(self, name: str) -> dict[str, Any]:
        reply = self.http.get(f"/tables/{name}")
        reply.raise_for_status()
        return dict(reply.json())

    def wait_ready(self, name: str, timeout: float = 90.0) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (t := self.table(name))["status"].get("phase") == "Ready" and t,
                timeout,
                f"table {name} Ready",
            )
        )


def start_platform(state_dir: Path, **options: Any) -> LocalPlatform:
    platform = LocalPlatform(state_dir, port=0, poll_interval=0.1, **options)
    platform.start()
    return platform


@pytest.fixture
def helpers() -> SimpleNamespace:
    """The helpers above, for test modules (importlib mode cannot import conftest)."""
    return SimpleNamespace(wait_for=wait_for, start_platform=start_platform, Api=Api)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[LocalPlatform]:
    running = start_platform(tmp_path / "state")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def api(platform: LocalPlatform) -> Iterator[Api]:
    client = Api(platform)
    yield client
    client.http.close()
