"""Fixtures every test directory may use: certificates made in the test run.

``tls_files`` writes a CA, a server certificate for 127.0.0.1/localhost (and the
shared PS server name), a client certificate signed by the same CA, and a second,
unrelated CA, as PEM files, with the platform's own recipe
(``recstore.local.certificates``). Test modules cannot import a helper module under
--import-mode=importlib, so it travels as a fixture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

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
