"""`recstore up`: the admin API on SQLite and the local provisioner, in one process.

This is the embedded default — the whole platform on one machine with no
cluster. The admin API is the same app a cluster runs; only its provisioner
differs (PS node processes here instead of EmbeddingTable resources). On start
the pools and tables already in the catalogue are provisioned again, so their nodes
come back with the rows of their data directories.

Four secrets live in the state dir (``recstore.local.state_dir``): the admin
token (for the user, the CLI and the dashboard); the provisioner token, the local
provisioner's own identity, the only one the admin API lets register nodes and
write shard status; the PS token every node requires, so that knowing where a
node listens (discovery tells any viewer) lets no one write to it; and the
read-only token the nodes of inference tables also accept, for readers.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from recstore.admin.main import create_app
from recstore.admin.settings import Settings
from recstore.core.pool import PoolSpec
from recstore.core.reshard.plan import DEFAULT_BATCH_SLOTS
from recstore.core.spec import TableSpec
from recstore.core.tls import LocalTls, http_verify
from recstore.local.provisioner import LocalProvisioner
from recstore.local.reporting import AdminReporter
from recstore.local.state_dir import (
    ADMIN_TOKEN_FILE,
    DEFAULT_STATE_DIR,
    PROVISIONER_TOKEN_FILE,
    PS_READ_ONLY_TOKEN_FILE,
    PS_TOKEN_FILE,
    ensure_token,
    secure_state_dir,
)

log = logging.getLogger(__name__)


class LocalPlatform:
    """Starts and stops the admin API (in a thread) and the local provisioner."""

    def __init__(
        self,
        state_dir: Path = DEFAULT_STATE_DIR,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        device: str = "cpu",
        poll_interval: float = 0.5,
        tls: bool = False,
        online_resharding: bool = True,
        reshard_batch_slots: int = DEFAULT_BATCH_SLOTS,
        reshard_copy_rate: float = 0.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        catalogue = secure_state_dir(self.state_dir)
        self.token = ensure_token(self.state_dir, ADMIN_TOKEN_FILE)
        provisioner_token = ensure_token(self.state_dir, PROVISIONER_TOKEN_FILE)
        #: what trainers send the nodes (RECSTORE_PS_TOKEN); readers of inference tables
        #: may send the read-only one instead
        self.ps_token = ensure_token(self.state_dir, PS_TOKEN_FILE)
        self.ps_read_only_token = ensure_token(self.state_dir, PS_READ_ONLY_TOKEN_FILE)
        #: with ``tls``: the admin API serves HTTPS and the nodes TLS, from a CA of its own
        self.tls: LocalTls | None = None
        if tls:
            from recstore.local.certificates import ensure_local_tls

            self.tls = ensure_local_tls(self.state_dir)
        client_tls = self.tls.client if self.tls else None
        self._verify = http_verify(client_tls)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, int(self._socket.getsockname()[1])
        self.url = f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"
        self._reporter = AdminReporter(self.url, provisioner_token, tls=client_tls)
        self.provisioner = LocalProvisioner(
            self.state_dir,
            self._reporter,
            device=device,
            auth_token_file=self.state_dir / PS_TOKEN_FILE,
            read_only_token_file=self.state_dir / PS_READ_ONLY_TOKEN_FILE,
            poll_interval=poll_interval,
            tls=self.tls,
            online_resharding=online_resharding,
            reshard_batch_slots=reshard_batch_slots,
            reshard_copy_rate=reshard_copy_rate,
        )
        settings = Settings(
            database_url=f"sqlite:///{catalogue}",
            bootstrap_token_file=self.state_dir / ADMIN_TOKEN_FILE,
            provisioner_token_file=self.state_dir / PROVISIONER_TOKEN_FILE,
            secure_cookies=self.tls is not None,
        )
        app = create_app(settings, provisioner=self.provisioner)
        https = self.tls.server.uvicorn_options() if self.tls else {}
        config = uvicorn.Config(app, log_level="warning", lifespan="on", **https)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def start(self, *, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                ready = httpx.get(f"{self.url}/readyz", timeout=1.0, verify=self._verify)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the admin API did not become ready on {self.url}")
            time.sleep(0.05)
        for name, pool in self._catalogue("pools"):
            self.provisioner.create_pool(name, PoolSpec.model_validate(pool["spec"]))
        for _, table in self._catalogue("tables"):
            spec = TableSpec.model_validate(table["spec"])
            self.provisioner.create_table(spec, pool=table.get("pool"))
        # The catalogue still shows the status of the last run: replace it before
        # anyone reads it (nodes that are still starting make it Provisioning).
        self.provisioner.report_now()

    def _catalogue(self, collection: str) -> list[tuple[str, dict[str, Any]]]:
        """Every item of ``/api/v1/<collection>`` (tables, pools), by name."""
        items: list[tuple[str, dict[str, Any]]] = []
        headers = {"Authorization": f"Bearer {self.token}"}
        offset = 0
        while True:
            page = httpx.get(
                f"{self.url}/api/v1/{collection}",
                params={"limit": 500, "offset": offset},
                headers=headers,
                timeout=10.0,
                verify=self._verify,
            )
            page.raise_for_status()
            body = page.json()
            items += [(item["name"], item) for item in body["items"]]
            offset += len(body["items"])
            if not body["items"] or offset >= body["total"]:
                return items

    def stop(self) -> None:
        """Stop the nodes first (each writes a final checkpoint), then the API."""
        self.provisioner.close()
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._reporter.close()
        self._socket.close()
