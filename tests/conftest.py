"""Fixtures every test directory may use: certificates made in the test run.

``tls_files`` writes a CA, a server certificate for 127.0.0.1/localhost (and the
shared PS server name), a client certificate signed by the same CA, and a second,
unrelated CA, as PEM files. Test modules cannot import a helper module under
--import-mode=importlib, so it travels as a fixture.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
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


def _write_tls_files(directory: Path) -> TlsFiles:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def certificate(
        subject: str,
        key: ec.EllipticCurvePrivateKey,
        issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
        *,
        usage: x509.ObjectIdentifier | None = None,
        sans: list[x509.GeneralName] | None = None,
    ) -> x509.Certificate:
        issuer_name, issuer_key = issuer if issuer else (subject, key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), True)
        )
        if issuer is None:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )  # fmt: skip
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write(file: str, data: bytes) -> Path:
        path = directory / file
        path.write_bytes(data)
        return path

    pem = serialization.Encoding.PEM
    ca_key, other_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = certificate("recstore test CA", ca_key, None)
    server = certificate(
        "recstore test server",
        server_key,
        ("recstore test CA", ca_key),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.DNSName("localhost"),
            x509.DNSName(PS_SERVER_NAME),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ],
    )
    client = certificate(
        "recstore test trainer",
        client_key,
        ("recstore test CA", ca_key),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    other = certificate("unrelated CA", other_key, None)
    return TlsFiles(
        ca=write("ca.pem", ca.public_bytes(pem)),
        server_cert=write("server.pem", server.public_bytes(pem)),
        server_key=write("server-key.pem", key_pem(server_key)),
        client_cert=write("client.pem", client.public_bytes(pem)),
        client_key=write("client-key.pem", key_pem(client_key)),
        other_ca=write("other-ca.pem", other.public_bytes(pem)),
    )


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return _write_tls_files(tmp_path_factory.mktemp("tls"))
