"""Request bodies over the cap get 413 before they are read, ahead of authentication.

In process, the ASGI app is driven directly and the body bytes it pulled are
counted; against uvicorn in a subprocess, the service's peak RSS (VmHWM, reset through
clear_refs just before the request) shows what it held.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError
from starlette.types import Message

from recstore.admin import Settings, create_app

from .conftest import ADMIN_SECRET, bearer

MiB = 1 << 20
CAP = 4096
SPEC = {"name": "capped_t", "numEmbeddings": 10, "embeddingDim": 4, "shards": 1}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]
    taken: int  # body bytes the app pulled from the server


def asgi_post(
    app: FastAPI, path: str, content_type: str, total: int, *, declared: bool, chunk: int = 1024
) -> Answer:
    """POST ``total`` bytes in ``chunk``-byte messages straight to the ASGI app, counting
    how many of them the app asked the server for (TestClient reads a body whole first)."""
    headers = [(b"content-type", content_type.encode())]
    if declared:
        headers.append((b"content-length", str(total).encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("admin", 80),
    }  # fmt: skip
    taken = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal taken
        if taken >= total:
            return {"type": "http.disconnect"}
        size = min(chunk, total - taken)
        taken += size
        return {"type": "http.request", "body": b" " * size, "more_body": taken < total}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    head = {k.decode(): v.decode() for k, v in start["headers"]}
    return Answer(start["status"], head, json.loads(body), taken)


@pytest.fixture
def capped_app(tmp_path: Path) -> Iterator[FastAPI]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'admin.db'}",
        bootstrap_token=SecretStr(ADMIN_SECRET),
        max_request_body_bytes=CAP,
    )
    app = create_app(settings)
    yield app
    app.state.context.engine.dispose()


@pytest.fixture
def capped(capped_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(capped_app) as client:
        yield client


def test_a_declared_length_over_the_cap_is_refused_unread(capped_app: FastAPI) -> None:
    answer = asgi_post(capped_app, "/api/v1/tables", "application/json", 10 * CAP, declared=True)
    assert answer.status == 413, answer
    assert answer.body["detail"] == (
        f"request body of {10 * CAP} bytes is over the limit of {CAP} bytes "
        "(RECSTORE_MAX_REQUEST_BODY_BYTES)"
    )
    assert answer.headers["connection"] == "close"
    assert answer.taken == 0


@pytest.mark.parametrize(
    ("path", "content_type"),
    [("/api/v1/tables", "application/json"), ("/ui/login", "application/x-www-form-urlencoded")],
)
def test_a_streamed_body_is_refused_as_it_passes_the_cap(
    capped_app: FastAPI, path: str, content_type: str
) -> None:
    answer = asgi_post(capped_app, path, content_type, 100 * CAP, declared=False)
    assert answer.status == 413, answer
    assert f"over the limit of {CAP} bytes" in answer.body["detail"]
    assert answer.headers["connection"] == "close"
    assert answer.taken <= CAP + 1024  # stopped at the chunk that passed the cap


def test_bodies_within_the_cap_reach_authentication_and_the_route(capped: TestClient) -> None:
    assert capped.post("/api/v1/tables", json=SPEC).status_code == 401
    created = capped.post("/api/v1/tables", json=SPEC, headers=bearer(ADMIN_SECRET))
    assert created.status_code == 201, created.text
    streamed = capped.post(
        "/api/v1/tokens",
        content=iter([b'{"name": "streamed", ', b'"role": "viewer"}']),
        headers=bearer(ADMIN_SECRET) | {"Content-Type": "application/json"},
    )
    assert streamed.status_code == 201, streamed.text


def test_the_cap_is_16_mib_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().max_request_body_bytes == 16 * MiB
    monkeypatch.setenv("RECSTORE_MAX_REQUEST_BODY_BYTES", "1024")
    assert Settings().max_request_body_bytes == 1024
    with pytest.raises(ValidationError):
        Settings(max_request_body_bytes=0)


# -- uvicorn in a subprocess: what the service holds -------------------------------
SERVE = """
import asyncio, socket, sys
import uvicorn
from pydantic import SecretStr
from recstore.admin import Settings, create_app

app = create_app(Settings(database_url=sys.argv[1], bootstrap_token=SecretStr(sys.argv[2])))
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(64)
print(sock.getsockname()[1], flush=True)
asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock]))
"""
GROWTH_BOUND = 64 * MiB
BIG = 256 * MiB


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def post(port: int, headers: str, chunks: Iterator[bytes]) -> int:
    """POST ``chunks`` raw, stopping as soon as an answer arrives; its status code."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(f"POST /api/v1/tables HTTP/1.1\r\nHost: admin\r\n{headers}\r\n".encode())
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        answer = b""
        while b"\r\n" not in answer:
            received = sock.recv(4096)
            assert received, f"connection closed after {answer!r}"
            answer += received
    return int(answer.split()[1])


def _plain(total: int) -> Iterator[bytes]:
    """A JSON body of ``total`` bytes (an empty object, then spaces) in 1 MiB pieces."""
    yield b"{}" + b" " * (MiB - 2)
    for _ in range(total // MiB - 1):
        yield b" " * MiB


def _chunked(total: int) -> Iterator[bytes]:
    for chunk in _plain(total):
        yield b"%x\r\n%s\r\n" % (len(chunk), chunk)
    yield b"0\r\n\r\n"


@dataclass
class Service:
    process: subprocess.Popen[str]
    port: int


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    command = [sys.executable, "-c", SERVE, f"sqlite:///{tmp_path / 'admin.db'}", ADMIN_SECRET]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    yield Service(process, int(process.stdout.readline()))
    process.kill()
    process.wait(timeout=30)


@pytest.mark.parametrize(
    ("headers", "chunks"),
    [
        (f"Content-Type: application/json\r\nContent-Length: {BIG}\r\n", _plain),
        ("Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n", _chunked),
    ],
    ids=["content-length", "chunked"],
)
def test_a_256_mib_unauthenticated_post_is_refused_holding_little(
    service: Service, headers: str, chunks: Callable[[int], Iterator[bytes]]
) -> None:
    small = f"Content-Type: application/json\r\nContent-Length: {MiB}\r\n"
    assert post(service.port, small, _plain(MiB)) == 401  # warm: the app answered a request once
    pid = service.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = _status_bytes(pid, "VmRSS")
    status = post(service.port, headers, chunks(BIG))
    grown = _status_bytes(pid, "VmHWM") - start
    assert grown < GROWTH_BOUND, f"peak RSS grew by {grown / MiB:.0f} MiB"
    assert status == 413
