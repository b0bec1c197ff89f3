"""TLS settings of every RecStore channel: gRPC to the PS nodes and HTTPS to the admin API.

One definition for both ends. ``ServerTls`` (certificate, key, optional client CA:
with one, clients must present a certificate it signed) gives a PS node its gRPC
server credentials and the admin API its uvicorn arguments. ``ClientTls`` (the CA
that signed the servers, optional client certificate and key for mutual TLS,
optional server name) gives the SDK, the CLI, the local provisioner and the
operator their gRPC channels and the ``ssl.SSLContext`` their HTTP clients verify
the admin API with. Clients read it from ``RECSTORE_TLS_CA``, ``RECSTORE_TLS_CERT``,
``RECSTORE_TLS_KEY`` and ``RECSTORE_TLS_SERVER_NAME``; with none set, channels stay
plaintext (the loopback default of ``recstore up``).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# grpc is imported where a channel or credentials are made, so that the CLI's HTTP-only
# commands start without it.
if TYPE_CHECKING:
    import grpc

CA_ENV = "RECSTORE_TLS_CA"
CERT_ENV = "RECSTORE_TLS_CERT"
KEY_ENV = "RECSTORE_TLS_KEY"
#: the name the servers' certificate carries, when clients dial them by another name
#: (the operator dials shards by pod IP; pods share one certificate).
SERVER_NAME_ENV = "RECSTORE_TLS_SERVER_NAME"

ChannelOptions = Sequence[tuple[str, Any]]


class TlsConfigError(ValueError):
    """A TLS setting that cannot work: a missing or unreadable file, a half-given pair."""


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TlsConfigError(f"cannot read the TLS {what} {path}: {error.strerror}") from None
    if b"-----BEGIN" not in data:
        raise TlsConfigError(f"the TLS {what} {path} is not PEM")
    return data


def _pair(cert: Path | None, key: Path | None, owner: str) -> None:
    if (cert is None) != (key is None):
        raise TlsConfigError(f"{owner}: a TLS certificate and its key go together; give both")


#: the ``recstore ps-node`` / ``recstore admin`` options naming a ServerTls's files
CERT_FLAG, KEY_FLAG, CLIENT_CA_FLAG = "--tls-cert", "--tls-key", "--tls-client-ca"


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and key; ``client_ca`` set: mutual TLS is required.

    Paths only, so a renderer can name files of another machine (a pod's mounted
    Secret); ``from_options`` and the credential methods read and check them.
    """

    cert: Path
    key: Path
    client_ca: Path | None = None

    @classmethod
    def from_options(
        cls, cert: Path | None, key: Path | None, client_ca: Path | None
    ) -> ServerTls | None:
        """The server's TLS from its command-line options; None (plaintext) when none given.

        Every file is read now: a bad one fails the start, named, not the first handshake.
        """
        _pair(cert, key, "server")
        if cert is None or key is None:
            if client_ca is not None:
                raise TlsConfigError("a client CA (mutual TLS) needs a server certificate and key")
            return None
        tls = cls(cert, key, client_ca)
        tls.grpc_credentials()
        return tls

    def args(self) -> list[str]:
        """The command-line options that give a server this TLS."""
        out = [CERT_FLAG, str(self.cert), KEY_FLAG, str(self.key)]
        return out + ([CLIENT_CA_FLAG, str(self.client_ca)] if self.client_ca else [])

    @property
    def mode(self) -> str:
        """``"mutual"`` when client certificates are required, else ``"server"``."""
        return "mutual" if self.client_ca is not None else "server"

    def pems(self) -> tuple[bytes, bytes, bytes | None]:
        """(key, certificate chain, client CA or None) as PEM, read now."""
        roots = _read(self.client_ca, "client CA") if self.client_ca else None
        return _read(self.key, "key"), _read(self.cert, "certificate"), roots

    def grpc_credentials(self) -> grpc.ServerCredentials:
        import grpc

        key, cert, roots = self.pems()
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=roots, require_client_auth=roots is not None
        )

    def uvicorn_options(self) -> dict[str, Any]:
        """``uvicorn.run`` keyword arguments serving HTTPS (client certificates when mTLS)."""
        options: dict[str, Any] = {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}
        if self.client_ca is not None:
            options |= {"ssl_ca_certs": str(self.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (``ca``) and, for mutual TLS, who it is (``cert``, ``key``)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        _pair(self.cert, self.key, "client")
        _read(self.ca, "CA")
        if self.cert is not None and self.key is not None:
            _read(self.cert, "client certificate")
            _read(self.key, "client key")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ClientTls | None:
        """``RECSTORE_TLS_*``; None (plaintext) when no CA is set."""
        env = os.environ if environ is None else environ
        ca, cert, key = (env.get(name, "").strip() for name in (CA_ENV, CERT_ENV, KEY_ENV))
        if not ca:
            if cert or key:
                raise TlsConfigError(f"{CERT_ENV}/{KEY_ENV} are set but {CA_ENV} is not")
            return None
        return cls(
            Path(ca),
            Path(cert) if cert else None,
            Path(key) if key else None,
            env.get(SERVER_NAME_ENV, "").strip() or None,
        )

    def pems(self) -> tuple[bytes, bytes | None, bytes | None]:
        """(CA, client key, client certificate) as PEM, read now; no identity: None, None."""
        if self.key is not None and self.cert is not None:
            key, cert = _read(self.key, "client key"), _read(self.cert, "client certificate")
            return _read(self.ca, "CA"), key, cert
        return _read(self.ca, "CA"), None, None

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        import grpc

        ca, key, cert = self.pems()
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def ssl_context(self) -> ssl.SSLContext:
        """For HTTPS clients (httpx ``verify=``, urllib ``context=``): verify with ``ca``."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.cert is not None and self.key is not None:
            context.load_cert_chain(str(self.cert), str(self.key))
        return context


def channel(endpoint: str, tls: ClientTls | None, options: ChannelOptions = ()) -> grpc.Channel:
    """A blocking channel to ``endpoint``: TLS when ``tls`` is given, plaintext otherwise."""
    import grpc

    if tls is None:
        return grpc.insecure_channel(endpoint, options=list(options))
    return grpc.secure_channel(
        endpoint, tls.grpc_credentials(), options=[*options, *tls.channel_options()]
    )


def aio_channel(
    endpoint: str, tls: ClientTls | None, options: ChannelOptions = ()
) -> grpc.aio.Channel:
    """``channel`` for asyncio callers."""
    import grpc

    if tls is None:
        return grpc.aio.insecure_channel(endpoint, options=list(options))
    return grpc.aio.secure_channel(
        endpoint, tls.grpc_credentials(), options=[*options, *tls.channel_options()]
    )


def http_verify(tls: ClientTls | None) -> ssl.SSLContext | bool:
    """httpx's ``verify=``: the CA's context with TLS settings, the system store otherwise."""
    return tls.ssl_context() if tls is not None else True


@dataclass(frozen=True)
class LocalTls:
    """Both ends on one machine: what the platform's servers present, what its clients trust."""

    server: ServerTls
    client: ClientTls
