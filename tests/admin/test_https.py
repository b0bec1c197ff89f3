"""The admin API over HTTPS (uvicorn with ``ServerTls.uvicorn_options``), verified by the
CLI's client and the SDK's discovery with the CA, and refused by clients without it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from pydantic import SecretStr

from recstore.admin import Settings, create_app
from recstore.cli.api_client import AdminClient, CliError
from recstore.client.errors import BackendError, TableNotInitialized
from recstore.client.remote.tables import discover
from recstore.core.tls import ClientTls, ServerTls

SECRET = "bootstrap-secret-for-https"


@pytest.fixture
def https_admin(tmp_path: Path, tls_files, monkeypatch) -> Iterator[str]:
    for name in ("RECSTORE_TLS_CA", "RECSTORE_TLS_CERT", "RECSTORE_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'admin.db'}", bootstrap_token=SecretStr(SECRET)
    )
    app = create_app(settings)
    tls = ServerTls(tls_files.server_cert, tls_files.server_key)
    config = uvicorn.Config(app, log_level="warning", **tls.uvicorn_options())
    server = uvicorn.Server(config)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    started = threading.Event()
    original_startup = server.startup

    async def startup(sockets=None):  # type: ignore[no-untyped-def]
        await original_startup(sockets=sockets)
        started.set()

    server.startup = startup  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    assert started.wait(30), "the admin API did not start"
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        listener.close()
        app.state.context.engine.dispose()


def test_the_cli_client_verifies_the_admin_api_with_the_ca(https_admin, tls_files) -> None:
    client = AdminClient(https_admin, SECRET, tls=ClientTls(tls_files.ca))
    try:
        assert client.get("/tables")["items"] == []
    finally:
        client.close()


def test_the_cli_reads_the_ca_from_the_environment(https_admin, tls_files, monkeypatch) -> None:
    monkeypatch.setenv("RECSTORE_TLS_CA", str(tls_files.ca))
    client = AdminClient(https_admin, SECRET)
    try:
        assert client.get("/tables")["total"] == 0
    finally:
        client.close()


@pytest.mark.parametrize("trusted", ["system store", "other CA"])
def test_a_client_without_the_ca_refuses_the_admin_api(
    https_admin, tls_files, trusted: str
) -> None:
    tls = ClientTls(tls_files.other_ca) if trusted == "other CA" else None
    client = AdminClient(https_admin, SECRET, tls=tls)
    try:
        with pytest.raises(CliError, match="CERTIFICATE_VERIFY_FAILED"):
            client.get("/tables")
    finally:
        client.close()


def test_plain_http_gets_no_answer_from_the_https_server(https_admin) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(https_admin.replace("https://", "http://") + "/healthz", timeout=5)


def test_sdk_discovery_goes_over_https_with_the_ca(https_admin, tls_files) -> None:
    with pytest.raises(TableNotInitialized):  # the round trip worked: no such table yet
        discover(https_admin, "clicks", SECRET, ClientTls(tls_files.ca))
    with pytest.raises(BackendError, match="CERTIFICATE_VERIFY_FAILED"):
        discover(https_admin, "clicks", SECRET, ClientTls(tls_files.other_ca))
