"""`recstore up`: the admin API on SQLite and the local provisioner, in one process.

This is the embedded default — the whole platform on one machine with no
cluster. The admin API is the same app a cluster runs; only its provisioner
differs (PS node processes here instead of EmbeddingTable resources). On start
the tables already in the catalogue are provisioned again, so their nodes
come back with the rows of their data directories.

Two secrets live in the state dir: the admin token (for the user, the CLI and
the dashboard) and the provisioner token, the local provisioner's own identity,
the only one the admin API lets register nodes and write shard status.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import stat
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from recstore.admin.main import create_app
from recstore.admin.settings import Settings
from recstore.core.migration import DEFAULT_BATCH_SLOTS
from recstore.core.spec import TableSpec
from recstore.core.tls import LocalTls, http_verify
from recstore.local.provisioner import LocalProvisioner
from recstore.local.reporting import AdminReporter

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path.home() / ".recstore"
TOKEN_FILE = "admin-token"
PROVISIONER_TOKEN_FILE = "provisioner-token"


class InsecureStateDir(RuntimeError):
    """A token file can be read by other users: refused, not used."""


def ensure_token(state_dir: Path, name: str = TOKEN_FILE) -> str:
    """A platform token (``admin-token`` by default): created once, readable by its owner only.

    A token file others can read is refused: anyone who read it holds its rights.
    """
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the token and all the data
    path = state_dir / name
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise InsecureStateDir(
            f"token file {path} is readable by other users (mode {mode:04o}); it grants "
            f"{name.removesuffix('-token')} rights: run `chmod 600 {path}` (or remove it "
            "for a new token), then start again"
        )
    return path.read_text().strip()


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
        self.token = ensure_token(self.state_dir)
        provisioner_token = ensure_token(self.state_dir, PROVISIONER_TOKEN_FILE)
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
            poll_interval=poll_interval,
            tls=self.tls,
            online_resharding=online_resharding,
            reshard_batch_slots=reshard_batch_slots,
            reshard_copy_rate=reshard_copy_rate,
        )
        settings = Settings(
            database_url=f"sqlite:///{self.state_dir / 'admin.db'}",
            bootstrap_token_file=self.state_dir / TOKEN_FILE,
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
        for spec in self._catalogue():
            self.provisioner.create_table(spec)
        # The catalogue still shows the status of the last run: replace it before
        # anyone reads it (nodes that are still starting make it Provisioning).
        self.provisioner.report_now()

    def _catalogue(self) -> list[TableSpec]:
        specs: list[TableSpec] = []
        headers = {"Authorization": f"Bearer {self.token}"}
        offset = 0
        while True:
            page = httpx.get(
                f"{self.url}/api/v1/tables",
                params={"limit": 500, "offset": offset},
                headers=headers,
                timeout=10.0,
                verify=self._verify,
            )
            page.raise_for_status()
            body = page.json()
            specs += [TableSpec.model_validate(item["spec"]) for item in body["items"]]
            offset += len(body["items"])
            if not body["items"] or offset >= body["total"]:
                return specs

    def stop(self) -> None:
        """Stop the nodes first (each writes a final checkpoint), then the API."""
        self.provisioner.close()
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._reporter.close()
        self._socket.close()
