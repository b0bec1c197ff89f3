"""The ``--tls-cert``/``--tls-key``/``--tls-client-ca`` options of the serving commands.

``recstore ps-node`` and ``recstore admin`` take the same three, defined here
once, and turn them into ``recstore.core.tls.ServerTls`` with one clear error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recstore.core.tls import CERT_FLAG, CLIENT_CA_FLAG, KEY_FLAG, ServerTls, TlsConfigError

CertOption = Annotated[
    Path | None,
    typer.Option(CERT_FLAG, help="PEM certificate chain: serve over TLS (with --tls-key)."),
]
KeyOption = Annotated[Path | None, typer.Option(KEY_FLAG, help="PEM private key of --tls-cert.")]
ClientCaOption = Annotated[
    Path | None,
    typer.Option(
        CLIENT_CA_FLAG,
        help="PEM CA: require client certificates it signed (mutual TLS).",
    ),
]


def server_tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> ServerTls | None:
    """The options as ServerTls (None: plaintext); a bad combination or file is a usage error."""
    try:
        return ServerTls.from_options(cert, key, client_ca)
    except TlsConfigError as error:
        raise typer.BadParameter(str(error), param_hint=f"{CERT_FLAG}/{KEY_FLAG}") from None
