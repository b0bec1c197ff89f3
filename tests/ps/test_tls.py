"""gRPC over TLS: a TLS client works end to end, everything else is refused, and the PS
token is not on the wire.

Certificates are made in the test run (``tls_files``, tests/conftest.py). A loopback TCP
proxy records every byte between client and node, so the test can look for the token.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from recstore.client.remote.backend import GrpcBackend
from recstore.core import TableSpec
from recstore.core.control import ControlClient, ControlError
from recstore.core.tls import ClientTls, ServerTls, TlsConfigError
from recstore.ps.serve.server import ServerHandle, start_in_thread

TOKEN = "ps-token-that-must-not-leak-7f3a"


class RecordingProxy:
    """Forwards 127.0.0.1:port to ``upstream`` and keeps a copy of every byte both ways."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.seen = bytearray()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self._sockets += [downstream, upstream]
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                with self._lock:  # recorded before it is forwarded: a reply implies it is here
                    self.seen += chunk
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for s in self._sockets:
            s.close()


def _spec(name: str = "emb") -> TableSpec:
    return TableSpec(name=name, num_embeddings=100, embedding_dim=4)


@pytest.fixture
def server_tls(tls_files) -> ServerTls:
    return ServerTls(tls_files.server_cert, tls_files.server_key)


@pytest.fixture
def tls_node(tmp_path: Path, server_tls: ServerTls) -> Iterator[ServerHandle]:
    with start_in_thread(data_dir=tmp_path, auth_token=TOKEN, tls=server_tls) as handle:
        yield handle


@pytest.fixture
def mtls_node(tmp_path: Path, tls_files) -> Iterator[ServerHandle]:
    tls = ServerTls(tls_files.server_cert, tls_files.server_key, client_ca=tls_files.ca)
    with start_in_thread(data_dir=tmp_path, auth_token=TOKEN, tls=tls) as handle:
        yield handle


def _create(endpoint: str, tls: ClientTls | None) -> None:
    with ControlClient(endpoint, token=TOKEN, tls=tls, timeout=10) as client:
        client.create_table(_spec())


def test_tls_client_pulls_and_updates_end_to_end(tls_node, tls_files) -> None:
    backend = GrpcBackend(
        endpoints=(tls_node.address,), token=TOKEN, tls=ClientTls(tls_files.ca), rpc_timeout=10
    )
    try:
        backend.create_table(_spec())
        keys = torch.tensor([1, 5, 9])
        values = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        backend.push("emb", keys, values)
        torch.testing.assert_close(backend.pull("emb", keys), values)
        backend.update("emb", keys, torch.ones(3, 4), lr=0.5)  # sgd: w -= lr * g
        torch.testing.assert_close(backend.pull("emb", keys), values - 0.5)
    finally:
        backend.close()


def test_sdk_reads_the_ca_from_the_environment(tls_node, tls_files, monkeypatch) -> None:
    monkeypatch.setenv("RECSTORE_TLS_CA", str(tls_files.ca))
    backend = GrpcBackend(endpoints=(tls_node.address,), token=TOKEN, rpc_timeout=10)
    try:
        assert backend.create_table(_spec()) is not None
    finally:
        backend.close()


def test_plaintext_client_is_refused_by_a_tls_server(tls_node) -> None:
    with pytest.raises(ControlError) as refused:
        _create(tls_node.address, None)
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE


def test_client_without_the_ca_refuses_the_server(tls_node, tls_files) -> None:
    with pytest.raises(ControlError) as refused:
        _create(tls_node.address, ClientTls(tls_files.other_ca))
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE


def test_a_server_name_override_verifies_a_node_dialled_by_another_name(
    tls_node, tls_files
) -> None:
    """The operator dials pods by IP; the pods' certificate names the shared server name."""
    by_name = ClientTls(tls_files.ca, server_name=tls_files.server_name)
    _create(tls_node.address, by_name)
    wrong = ClientTls(tls_files.ca, server_name="someone-else")
    with pytest.raises(ControlError):
        _create(tls_node.address, wrong)


def test_mutual_tls_refuses_a_client_without_a_certificate(mtls_node, tls_files) -> None:
    with pytest.raises(ControlError) as refused:
        _create(mtls_node.address, ClientTls(tls_files.ca))
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    _create(mtls_node.address, ClientTls(tls_files.ca, tls_files.client_cert, tls_files.client_key))


@pytest.mark.parametrize("encrypted", [False, True])
def test_the_ps_token_is_on_the_wire_only_without_tls(
    tmp_path: Path, tls_files, encrypted: bool
) -> None:
    server = ServerTls(tls_files.server_cert, tls_files.server_key) if encrypted else None
    with start_in_thread(data_dir=tmp_path, auth_token=TOKEN, tls=server) as node:
        proxy = RecordingProxy(("127.0.0.1", node.port))
        try:
            _create(f"127.0.0.1:{proxy.port}", ClientTls(tls_files.ca) if encrypted else None)
        finally:
            proxy.close()
    assert proxy.seen  # the call went through the proxy
    assert (TOKEN.encode() in proxy.seen) is not encrypted


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cert": "server_cert", "key": None, "client_ca": None}, "give both"),
        ({"cert": None, "key": None, "client_ca": "ca"}, "needs a server certificate"),
        ({"cert": "missing", "key": "server_key", "client_ca": None}, "cannot read"),
        ({"cert": "server_key_as_text", "key": "server_key", "client_ca": None}, "not PEM"),
    ],
)
def test_bad_server_tls_options_are_refused_with_the_file_named(
    tls_files, tmp_path: Path, kwargs: dict, message: str
) -> None:
    (tmp_path / "text").write_text("not a certificate")
    files = {
        "missing": tmp_path / "missing.pem",
        "server_key_as_text": tmp_path / "text",
        **{k: getattr(tls_files, k) for k in ("server_cert", "server_key", "ca")},
    }
    paths = {k: files[v] if v else None for k, v in kwargs.items()}
    with pytest.raises(TlsConfigError, match=message):
        ServerTls.from_options(paths["cert"], paths["key"], paths["client_ca"])


def test_client_tls_environment_needs_the_ca(tls_files) -> None:
    assert ClientTls.from_environment({}) is None
    with pytest.raises(TlsConfigError, match="RECSTORE_TLS_CA"):
        ClientTls.from_environment({"RECSTORE_TLS_CERT": str(tls_files.client_cert)})
    tls = ClientTls.from_environment(
        {
            "RECSTORE_TLS_CA": str(tls_files.ca),
            "RECSTORE_TLS_CERT": str(tls_files.client_cert),
            "RECSTORE_TLS_KEY": str(tls_files.client_key),
            "RECSTORE_TLS_SERVER_NAME": "recstore-ps",
        }
    )
    assert tls == ClientTls(
        tls_files.ca, tls_files.client_cert, tls_files.client_key, "recstore-ps"
    )


@pytest.mark.parametrize("command", ["ps-node", "admin"])
def test_serving_commands_refuse_half_a_tls_pair(tls_files, tmp_path: Path, command: str) -> None:
    from typer.testing import CliRunner

    from recstore.cli import app

    args = [command, "--tls-cert", str(tls_files.server_cert)]
    if command == "ps-node":
        args += ["--data-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "give both" in result.output
    assert not any(tmp_path.iterdir())  # nothing started, nothing written
