"""`recstore up --tls`: the admin API over HTTPS and the PS nodes over TLS from a CA the
platform keeps in its state dir; the SDK trains through both with RECSTORE_TLS_CA."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import pytest
import torch

from recstore import RecStoreClient
from recstore.core.control import ControlClient, ControlError
from recstore.local.certificates import ensure_local_tls
from recstore.local.platform import LocalPlatform

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_platform_serves_tls_end_to_end(
    tmp_path: Path, helpers: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    platform = LocalPlatform(tmp_path / "state", port=0, poll_interval=0.1, tls=True)
    assert platform.tls is not None
    platform.start()
    try:
        assert platform.url.startswith("https://127.0.0.1:")
        ca = platform.tls.client.ca
        key_mode = stat.S_IMODE(platform.tls.server.key.stat().st_mode)
        assert key_mode == 0o600
        with pytest.raises(httpx.ConnectError):  # no CA: the certificate is not trusted
            httpx.get(f"{platform.url}/readyz", timeout=5)
        http = httpx.Client(
            base_url=f"{platform.url}/api/v1",
            headers={"Authorization": f"Bearer {platform.token}"},
            verify=platform.tls.client.ssl_context(),
            timeout=30,
        )
        spec = {"name": "clicks", "numEmbeddings": 100, "embeddingDim": 4, "shards": 1}
        http.post("/tables", json=spec).raise_for_status()

        def ready() -> dict | None:
            table = http.get("/tables/clicks").json()
            return table if table["status"].get("phase") == "Ready" else None

        table = helpers.wait_for(ready, 90, "table Ready (the provisioner reached it over TLS)")
        (endpoint,) = [s["endpoint"] for s in table["status"]["shards"]]
        with pytest.raises(ControlError) as refused:  # the node speaks TLS only
            ControlClient(endpoint, token=platform.token, timeout=5).stats("clicks")
        assert refused.value.code is grpc.StatusCode.UNAVAILABLE

        monkeypatch.setenv("RECSTORE_TLS_CA", str(ca))
        client = RecStoreClient(role="tls-e2e")
        try:
            client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)
            client.init_data("clicks", (100, 4), torch.float32)
            ids = torch.tensor([3, 7])
            before = client.pull("clicks", ids)
            client.update("clicks", ids, torch.ones(2, 4))
            assert not torch.equal(client.pull("clicks", ids), before)
        finally:
            client.close()
        http.close()
    finally:
        platform.stop()
    # a restart keeps the CA clients already trust
    assert ensure_local_tls(tmp_path / "state").client.ca.read_bytes() == ca.read_bytes()
