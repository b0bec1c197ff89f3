"""Fixtures every test directory may use: certificates made in the test run, the real
admin API served on loopback, fake HTTP servers.

``tls_files`` writes a CA, a server certificate for 127.0.0.1/localhost (and the
shared PS server name), a client certificate signed by the same CA, and a second,
unrelated CA, as PEM files, with the platform's own recipe
(``recstore.local.certificates``). ``serve_admin`` serves an admin API app over HTTP
in a thread, for clients that need a real server (the operator's mirror, the CLI).
``fake_http`` starts HTTP servers on loopback that answer every GET as a test says
(an admin API's discovery, a metrics target, another origin's page) and record what
they were asked. These travel as fixtures so that every test directory reaches them
the same way.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

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


class HttpRequest(NamedTuple):
    """A GET a fake server was asked: its path and headers (``headers.get(name)``)."""

    path: str
    headers: Message


#: (status, headers, body) of a fake server's answer
HttpAnswer = tuple[int, Mapping[str, str], bytes]


class FakeHttp:
    """An HTTP server on 127.0.0.1 answering every GET with ``answer(request)``.

    ``requests`` holds what it was asked, in order; ``answer`` may be replaced
    between calls. Content-Length is always set from the body.
    """

    def __init__(self, answer: Callable[[HttpRequest], HttpAnswer]) -> None:
        self.answer = answer
        self.requests: list[HttpRequest] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                request = HttpRequest(self.path, self.headers)
                fake.requests.append(request)
                status, headers, body = fake.answer(request)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``"""
        return f"127.0.0.1:{self._server.server_port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, no trailing slash"""
        return f"http://{self.address}"

    @staticmethod
    def json(status: int, document: Any) -> HttpAnswer:
        """An answer whose body is ``document`` as JSON."""
        return status, {"Content-Type": "application/json"}, json.dumps(document).encode()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class FakeHttpServers:
    """``fake_http(answer)`` starts a ``FakeHttp``; all of them stop when the test ends."""

    json = staticmethod(FakeHttp.json)

    def __init__(self) -> None:
        self.started: list[FakeHttp] = []

    def __call__(self, answer: Callable[[HttpRequest], HttpAnswer]) -> FakeHttp:
        server = FakeHttp(answer)
        self.started.append(server)
        return server


@pytest.fixture
def fake_http() -> Iterator[FakeHttpServers]:
    servers = FakeHttpServers()
    yield servers
    for server in servers.started:
        server.close()


@pytest.fixture(scope="session")
def grpc_apt_packages() -> list[str]:
    """The system packages gRPC C++ comes from, as cmake/grpc.cmake names them (the one list
    the install script and the images' builder stages must agree with)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "cmake" / "grpc.cmake").read_text()
    found = re.search(r"^set\(RECSTORE_GRPC_APT_PACKAGES ([^)]+)\)", text, re.MULTILINE)
    assert found, "cmake/grpc.cmake sets no RECSTORE_GRPC_APT_PACKAGES"
    return found.group(1).split()
