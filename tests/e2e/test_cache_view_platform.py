"""A trainer's caches in the table views: real nodes, the admin API, the CLI, the dashboard.

An NVE layer reads a two-shard table through a GPU tier (on CPU tensors, the
same torch code as on a GPU) and a host cache and reports both tiers'
counters; every node's TableStats, ``GET /tables/NAME/cache``, ``recstore get
table`` and the dashboard's table page (headless Chromium) then show them,
tier by tier.
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
from recstore.client.nve import layers
from recstore.client.nve.cache_report import client_name
from recstore.core.control import ControlClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
SPEC = {"name": "served", "numEmbeddings": 1000, "embeddingDim": 8, "shards": 2}


def test_a_trainers_gpu_and_host_cache_tiers_show_in_every_table_view(
    tmp_path: Path, helpers: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layers, "resolve_device", lambda *_: torch.device("cpu"))
    platform = helpers.start_platform(tmp_path / "state")
    client = RecStoreClient(role="cache-view")
    try:
        api = helpers.Api(platform)
        api.create_table(SPEC)
        ready = api.wait_ready("served")
        client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
        layer = nve.NVEmbedding(
            1000, 8, torch.float32, nve.LayerType.Hierarchical, gpu_cache_size=1 << 14,
            storage=nve.RemoteTable(client, "served"), optimize_for_training=False,
            config={"host_cache_size": 1 << 16, "cache_report_interval": 0},
        )  # fmt: skip
        keys = torch.tensor([3, 14, 15, 92, 653])
        for _ in range(3):
            layer(keys)
        layer.report_cache_stats()
        stats = layer.cache_stats()
        gpu = stats["gpu"]
        assert isinstance(gpu, dict) and (gpu["hits"], gpu["misses"]) == (10, 5)
        assert (stats["hits"], stats["misses"]) == (0, 5)  # the GPU tier's misses only
        who = client_name("cache-view")

        for shard in ready["status"]["shards"]:  # each node's own table view
            with ControlClient(shard["endpoint"], token=platform.ps_token) as control:
                shown = control.stats("served").client_caches
            assert [(c.client, c.layer, c.tier, c.figures.hits) for c in shown] == [
                (who, layer.name, "gpu", 10), (who, layer.name, "host", 0),
            ]  # fmt: skip

        view = api.http.get("/tables/served/cache").json()
        on_gpu, on_host = view["clients"]
        assert (on_gpu["tier"], on_gpu["hits"], on_gpu["misses"], on_gpu["resident_rows"]) == (
            "gpu", 10, 5, 5,
        )  # fmt: skip
        assert on_gpu["hit_rate"] == pytest.approx(2 / 3)
        assert on_gpu["capacity_bytes"] == gpu["capacity_bytes"]
        assert (on_host["tier"], on_host["misses"], on_host["resident_rows"]) == ("host", 5, 5)
        assert view["clients_total"]["gpu"]["hits"] == 10
        assert view["engine_total"] is None  # a host table: no engine GPU cache

        shown = CliRunner().invoke(
            app, ["get", "table", "served", "--admin-url", platform.url, "--token", platform.token]
        )
        assert shown.exit_code == 0, shown.output
        assert "CLIENT CACHE" in shown.output and "TIER" in shown.output
        assert "0.6667" in shown.output
        assert f"{gpu['bytes_used']}/{gpu['capacity_bytes']}" in shown.output

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
            assert first[0].endswith(f"/ {layer}") and first[1:3] == ["gpu", "lfu"]
            assert first[3:7] == ["10", "5", "0", "0.6667"]
            second = rows.nth(1).locator("td").all_inner_texts()
            assert second[1:7] == ["host", "lfu", "0", "5", "0", "0.0000"]
            totals = [rows.nth(i).locator("td").all_inner_texts()[:2] for i in (2, 3)]
            assert totals == [["total", "gpu"], ["total", "host"]]
            assert page.locator("#engine-cache").is_hidden()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=SCREENSHOTS / "table-caches.png", full_page=True)
        finally:
            browser.close()
    assert problems == []
