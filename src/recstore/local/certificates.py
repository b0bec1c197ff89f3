"""A private CA for ``recstore up --tls``: one CA and one server certificate for loopback.

The local platform's admin API and PS nodes serve with the server certificate
(127.0.0.1 and localhost); the SDK and the CLI verify them with the CA
(``RECSTORE_TLS_CA=<state dir>/tls/ca.pem``). Files are made once, kept in the
state dir (keys readable by the owner only) and made again when they near expiry.
``issue_ca`` and ``issue_certificate`` are the one certificate recipe; the tests
make theirs with it too.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from recstore.core.tls import ClientTls, LocalTls, ServerTls

TLS_DIR = "tls"
VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)
LOOPBACK_NAMES = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert: bytes
    key: bytes


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, validity: dt.timedelta
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
    )


def issue_ca(name: str, validity: dt.timedelta = VALIDITY) -> Issued:
    """A self-signed CA that may sign certificates (and nothing else)."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    cert = (
        _builder(name, _name(name), key, validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def issue_certificate(
    ca: Issued,
    name: str,
    *,
    dns_names: tuple[str, ...] = (),
    client: bool = False,
    validity: dt.timedelta = VALIDITY,
) -> Issued:
    """A leaf certificate signed by ``ca``: for a server at ``dns_names`` (names or IP
    addresses), or for a client (``client=True``)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key made by issue_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        _builder(name, ca_cert.subject, key, validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in dns_names]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def _fresh(path: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc - dt.datetime.now(dt.timezone.utc) > RENEW_BEFORE


def ensure_local_tls(state_dir: Path) -> LocalTls:
    """The platform's CA and loopback server certificate under ``state_dir/tls``."""
    directory = Path(state_dir) / TLS_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_pem, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    cert, key = directory / "server.pem", directory / "server-key.pem"
    if not (_fresh(ca_pem) and ca_key.exists()):
        ca = issue_ca("recstore local CA")
        _write(ca_key, ca.key, 0o600)
        _write(ca_pem, ca.cert, 0o644)
        cert.unlink(missing_ok=True)  # signed by the old CA
    if not (_fresh(cert) and key.exists()):
        ca = Issued(ca_pem.read_bytes(), ca_key.read_bytes())
        server = issue_certificate(ca, "recstore local server", dns_names=LOOPBACK_NAMES)
        _write(key, server.key, 0o600)
        _write(cert, server.cert, 0o644)
    return LocalTls(server=ServerTls(cert, key), client=ClientTls(ca_pem))
