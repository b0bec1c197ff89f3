"""A trainer's host cache in the table views: real nodes, the admin API, the CLI, the dashboard.

An NVE layer reads a two-shard table through a host cache and reports its
counters; every node's TableStats, ``GET /tables/NAME/cache``, ``recstore get
table`` and the dashboard's table page (headless Chromium) then show them.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

import recstore.nve as nve
from recstore import RecStoreClient
from recstore.cli import app
from recstore.client.nve.cache_report import client_name
from recstore.core.control import ControlClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
SPEC = {"name": "served", "numEmbeddings": 1000, "embeddingDim": 8, "shards": 2}


def test_a_trainers_host_cache_shows_in_every_table_view(
    tmp_path: Path, helpers: SimpleNamespace
) -> None:
    platform = helpers.start_platform(tmp_path / "state")
    client = RecStoreClient(role="cache-view")
    try:
        api = helpers.Api(platform)
        api.create_table(SPEC)
        ready = api.wait_ready("served")
        client.set_admin_url(platform.url, platform.token)
        layer = nve.NVEmbedding(
            1000, 8, torch.float32, nve.LayerType.Hierarchical,
            storage=nve.RemoteTable(client, "served"), optimize_for_training=False,
            config={"host_cache_size": 1 << 16, "cache_report_interval": 0}, device="cpu",
        )  # fmt: skip
        keys = torch.tensor([3, 14, 15, 92, 653])
        for _ in range(3):
            layer(keys)
        layer.report_cache_stats()
        stats = layer.cache_stats()
        assert (stats["hits"], stats["misses"]) == (10, 5)
        who = client_name("cache-view")

        for shard in ready["status"]["shards"]:  # each node's own table view
            with ControlClient(shard["endpoint"], token=platform.token) as control:
                (cache,) = control.stats("served").client_caches
            assert (cache.client, cache.layer, cache.figures.hits) == (who, layer.name, 10)

        view = api.http.get("/tables/served/cache").json()
        (cache,) = view["clients"]
        assert (cache["hits"], cache["misses"], cache["resident_rows"]) == (10, 5, 5)
        assert cache["hit_rate"] == pytest.approx(2 / 3)
        assert view["engine_total"] is None  # host tier: no GPU cache

        shown = CliRunner().invoke(
            app, ["get", "table", "served", "--admin-url", platform.url, "--token", platform.token]
        )
        assert shown.exit_code == 0, shown.output
        assert "CLIENT CACHE" in shown.output and "0.6667" in shown.output

        _dashboard_shows(platform.url, platform.token, layer.name)
        api.http.close()
    finally:
        client.close()
        platform.stop()


def _dashboard_shows(base_url: str, token: str, layer: str) -> None:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("pageerror", lambda e: problems.append(str(e)))
        try:
            page.goto(f"{base_url}/ui/login")
            page.fill("input[name=token]", token)
            page.click("button[type=submit]")
            page.wait_for_url(f"{base_url}/ui/")
            page.goto(f"{base_url}/ui/tables/served")
            page.wait_for_selector("#client-caches td:has-text('total')", timeout=30000)
            rows = page.locator("#client-caches tbody tr")
            first = rows.nth(0).locator("td").all_inner_texts()
            assert first[0].endswith(f"/ {layer}") and first[1] == "lfu"
            assert first[2:6] == ["10", "5", "0", "0.6667"]
            assert rows.nth(1).locator("td").all_inner_texts()[0] == "total"
            assert page.locator("#engine-cache").is_hidden()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=SCREENSHOTS / "table-caches.png", full_page=True)
        finally:
            browser.close()
    assert problems == []
