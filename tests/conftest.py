"""Fixtures every test directory may use: certificates made in the test run, and the real
admin API served on loopback.

``tls_files`` writes a CA, a server certificate for 127.0.0.1/localhost (and the
shared PS server name), a client certificate signed by the same CA, and a second,
unrelated CA, as PEM files, with the platform's own recipe
(``recstore.local.certificates``). ``serve_admin`` serves an admin API app over HTTP
in a thread, for clients that need a real server (the operator's mirror, the CLI).
Test modules cannot import a helper module under --import-mode=importlib, so these
travel as fixtures.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

#: the DNS name every PS pod's certificate carries (clients dial pods by IP and check this)
PS_SERVER_NAME = "recstore-ps"


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # signed nothing here: a client trusting only it refuses the server
    server_name: str = PS_SERVER_NAME


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    from recstore.local.certificates import issue_ca, issue_certificate

    directory = tmp_path_factory.mktemp("tls")

    def write(name: str, data: bytes) -> Path:
        path = directory / name
        path.write_bytes(data)
        return path

    ca = issue_ca("recstore test CA")
    names = ("localhost", "127.0.0.1", PS_SERVER_NAME)
    server = issue_certificate(ca, "recstore test server", dns_names=names)
    client = issue_certificate(ca, "recstore test trainer", client=True)
    return TlsFiles(
        ca=write("ca.pem", ca.cert),
        server_cert=write("server.pem", server.cert),
        server_key=write("server-key.pem", server.key),
        client_cert=write("client.pem", client.cert),
        client_key=write("client-key.pem", client.key),
        other_ca=write("other-ca.pem", issue_ca("unrelated CA").cert),
    )


@contextlib.contextmanager
def _serve_admin(app: FastAPI) -> Iterator[str]:
    listening = socket.create_server(("127.0.0.1", 0))  # queued until uvicorn accepts
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listening.close()
        app.state.context.engine.dispose()


@pytest.fixture(scope="session")
def serve_admin() -> Callable[[FastAPI], AbstractContextManager[str]]:
    """``with serve_admin(app) as url``: the admin API ``app`` served on loopback in a thread."""
    return _serve_admin
