"""``recstore admin``: serve the admin API and dashboard with uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer

from recstore.cli.tls_options import CertOption, ClientCaOption, KeyOption, server_tls


def register(app: typer.Typer) -> None:
    @app.command("admin")
    def admin(
        db: Annotated[
            str | None,
            typer.Option(
                "--db",
                help="SQLAlchemy database URL (default: $RECSTORE_DATABASE_URL, else a SQLite "
                "file under ~/.recstore); PostgreSQL as postgresql+psycopg://user@host/db",
            ),
        ] = None,
        host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="HTTP port", min=0, max=65535)] = 8080,
        log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
        tls_cert: CertOption = None,
        tls_key: KeyOption = None,
        tls_client_ca: ClientCaOption = None,
    ) -> None:
        """Run the admin API (catalogue, nodes, checkpoints, tokens, events) and dashboard."""
        tls = server_tls(tls_cert, tls_key, tls_client_ca)
        import uvicorn

        from recstore.admin import Settings, create_app

        overrides: dict[str, object] = {"host": host, "port": port}
        if db is not None:
            overrides["database_url"] = db
        if tls is not None:  # served over HTTPS itself: the login cookie is marked Secure
            overrides["secure_cookies"] = True
        settings = Settings(**overrides)  # type: ignore[arg-type]
        https = tls.uvicorn_options() if tls else {}
        uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, **https)
