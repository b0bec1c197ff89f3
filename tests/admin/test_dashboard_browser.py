"""The dashboard in headless Chromium: login, create a table, live charts, checkpoints, events.

Pages must render without console errors; screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import Gauge
from prometheus_client.exposition import start_http_server

from recstore.ps.serve.metrics import Metrics

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """The dashboard is storage-agnostic: the browser run uses SQLite only."""
    return f"sqlite:///{tmp_path / 'ui.db'}"


@pytest.fixture
def base_url(app: FastAPI) -> Iterator[str]:
    # The socket listens before the server thread starts: the kernel queues the
    # browser's first connection, so nothing waits for uvicorn's start-up.
    listening = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    listening.close()


@pytest.fixture
def ps_metrics() -> Iterator[tuple[str, Metrics]]:
    """A PS node's own metrics (recstore.ps.serve.metrics), served over HTTP while the page
    polls."""
    metrics = Metrics()
    registry = metrics.registry
    Gauge("recstore_ps_table_rows", "rows", ["table"], registry=registry).labels("ui_table").set(
        900
    )
    Gauge("recstore_ps_table_memory_bytes", "b", ["table"], registry=registry).labels(
        "ui_table"
    ).set(900 * 64)
    metrics.observe("Pull", "OK", 0.002)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield f"127.0.0.1:{server.server_port}", metrics
    server.shutdown()
    thread.join(timeout=10)


def _need_chromium() -> None:
    if not CHROMIUM.exists():
        # `make test` installs it (scripts/install_system_deps.sh); CI must not skip.
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")


def test_dashboard_flow(
    app: FastAPI,
    base_url: str,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
    ps_metrics: tuple[str, Metrics],
) -> None:
    _need_chromium()
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    token = admin_headers["Authorization"].split()[1]
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        try:
            page.goto(f"{base_url}/ui/")
            assert page.url.endswith("/ui/login")
            page.fill("input[name=token]", "wrong-token")
            page.click("button[type=submit]")
            assert "not valid" in page.inner_text("[role=alert]")
            page.fill("input[name=token]", token)
            page.click("button[type=submit]")
            page.wait_for_selector("#tables")
            page.screenshot(path=SCREENSHOTS / "tables-empty.png", full_page=True)

            # A rejected form shows the reason and creates nothing.
            page.fill("#create-table input[name=name]", "bad_lr")
            page.fill("#create-table input[name=num_embeddings]", "10")
            page.fill("#create-table input[name=embedding_dim]", "4")
            page.fill("#create-table input[name=lr]", "0")
            page.click("#create-table button[type=submit]")
            assert "greater than 0" in page.inner_text("#create-table [role=alert]")
            assert page.locator("#tables tr[data-table]").count() == 0

            page.fill("#create-table input[name=name]", "ui_table")
            page.fill("#create-table input[name=num_embeddings]", "100000")
            page.fill("#create-table input[name=embedding_dim]", "32")
            page.fill("#create-table input[name=shards]", "2")
            page.fill("#create-table input[name=lr]", "0.05")
            page.select_option("#create-table select[name=optimizer]", "adam")
            page.click("#create-table button[type=submit]")
            page.wait_for_url(f"{base_url}/ui/tables/ui_table")

            with TestClient(app) as api:  # a node of shard 0 reports in, as a PS node would
                node = api.post(
                    "/api/v1/nodes",
                    headers=provisioner_headers,
                    json={
                        "table": "ui_table",
                        "shard_index": 0,
                        "endpoint": "127.0.0.1:50051",
                        "metrics_endpoint": ps_metrics[0],
                    },
                ).json()
                api.post(
                    f"/api/v1/nodes/{node['id']}/heartbeat",
                    headers=provisioner_headers,
                    json={"ready": True, "rows": 900, "memory_bytes": 57600},
                )
            page.goto(f"{base_url}/ui/")
            row = page.locator("#tables tr[data-table=ui_table]")
            assert row.count() == 1 and "Pending" in row.inner_text()
            page.screenshot(path=SCREENSHOTS / "tables.png", full_page=True)

            page.click("text=ui_table")
            page.wait_for_selector("#shards")
            assert "127.0.0.1:50051" in page.inner_text("#shards")
            page.wait_for_selector("svg[data-series=rows] circle", timeout=15000)
            for _ in range(500):  # traffic between two polls -> QPS
                ps_metrics[1].observe("Pull", "OK", 0.002)
            page.wait_for_selector("svg[data-series=qps] circle", timeout=15000)
            page.click("#checkpoint-now")
            page.wait_for_selector("table.checkpoints td:has-text('Requested')")
            page.screenshot(path=SCREENSHOTS / "table.png", full_page=True)

            page.click("header >> text=Checkpoints")
            assert "ui_table" in page.inner_text("table.checkpoints")
            page.screenshot(path=SCREENSHOTS / "checkpoints.png", full_page=True)
            page.click("header >> text=Events")
            events = page.inner_text("#events")
            assert "table.create" in events and "checkpoint.request" in events
            page.screenshot(path=SCREENSHOTS / "events.png", full_page=True)

            # Logging out ends the session on the server: the old cookie, replayed, is dead.
            cookies = page.context.cookies()
            page.click("header >> text=Log out")
            page.wait_for_url(f"{base_url}/ui/login")
            replay = browser.new_context()
            replay.add_cookies(cookies)  # type: ignore[arg-type]
            again = replay.new_page()
            again.goto(f"{base_url}/ui/")
            assert again.url.endswith("/ui/login")
            replay.close()
        finally:
            browser.close()
    assert problems == []


def test_cross_origin_form_post_is_refused_in_a_real_browser(
    app: FastAPI, base_url: str, admin_headers: dict[str, str], fake_http: Any
) -> None:
    """A page of another origin posts the create-table form with the user's live session.

    The other origin is on the same host, so it is the same *site* and the
    browser does send the SameSite=Strict cookie: only the server's checks stop it.
    """
    _need_chromium()
    from playwright.sync_api import sync_playwright

    forged = f"""<!doctype html><form id="f" method="post" action="{base_url}/ui/tables">
      <input name="name" value="forged"><input name="num_embeddings" value="10">
      <input name="embedding_dim" value="4"><input name="csrf_token" value="guessed">
    </form><script>document.getElementById("f").submit()</script>"""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page()
        try:
            page.goto(f"{base_url}/ui/login")
            page.fill("input[name=token]", admin_headers["Authorization"].split()[1])
            page.click("button[type=submit]")
            page.wait_for_url(f"{base_url}/ui/")
            # another origin (same host, other port) serving the page, as an attacker's site
            page_of = (200, {"Content-Type": "text/html"}, forged.encode())
            attacker = fake_http(lambda request: page_of)
            with page.expect_response(f"{base_url}/ui/tables") as answer:
                page.goto(f"{attacker.url}/")
            assert answer.value.status == 403
            assert "cookie" in answer.value.request.all_headers()  # the session rode along
        finally:
            browser.close()
    with TestClient(app) as api:
        listed = api.get("/api/v1/tables", headers=admin_headers).json()
    assert listed["total"] == 0


def test_pools_page_lists_pools_with_their_tables_and_memory(
    app: FastAPI,
    base_url: str,
    admin_headers: dict[str, str],
    provisioner_headers: dict[str, str],
) -> None:
    _need_chromium()
    from playwright.sync_api import sync_playwright

    with TestClient(app) as api:
        pool = {"name": "criteo", "shards": 2, "placement": {"resources": {"memory": "1Gi"}}}
        assert api.post("/api/v1/pools", json=pool, headers=admin_headers).status_code == 201
        for name in ("c1", "c2"):
            table = {"name": name, "numEmbeddings": 1000, "embeddingDim": 16, "pool": "criteo"}
            assert api.post("/api/v1/tables", json=table, headers=admin_headers).status_code == 201
        status = {
            "phase": "Ready", "readyShards": 2,
            "tables": [
                {"name": "c1", "phase": "Ready", "shards": 2, "memoryBytes": 3 * 2**20},
                {"name": "c2", "phase": "Failed", "memoryBytes": 0, "placed": False},
            ],
            "memory": {"requestBytes": 2**30, "nodeBytes": 150 * 2**20,
                       "reservedBytes": 3 * 2**20},
        }  # fmt: skip
        reported = api.put("/api/v1/pools/criteo/status", json=status, headers=provisioner_headers)
        assert reported.status_code == 200, reported.text
    token = admin_headers["Authorization"].split()[1]
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        try:
            page.goto(f"{base_url}/ui/login")
            page.fill("input[name=token]", token)
            page.click("button[type=submit]")
            page.wait_for_selector("#tables")
            assert "criteo" in page.inner_text("#tables tr[data-table=c1]")  # its pool
            page.click("header >> text=Pools")
            page.wait_for_selector("#pools")
            row = page.locator("#pools tr[data-pool=criteo]")
            assert "Ready" in row.inner_text() and "2/2" in row.inner_text()
            assert row.locator("td.memory").inner_text() == "3.0 MiB / 1.00 GiB"
            tables = page.locator("table.pool-tables[data-pool=criteo]")
            assert "3.0 MiB" in tables.locator("tr[data-table=c1]").inner_text()
            assert "does not fit" in tables.locator("tr[data-table=c2]").inner_text()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=SCREENSHOTS / "pools.png", full_page=True)
            page.click("table.pool-tables >> text=c1")
            page.wait_for_url(f"{base_url}/ui/tables/c1")
        finally:
            browser.close()
    assert problems == []
