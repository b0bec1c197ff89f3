"""Service settings, read from the environment (prefix ``RECSTORE_``) or passed in tests."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE_PATH = Path.home() / ".recstore" / "admin.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RECSTORE_", extra="ignore")

    #: SQLAlchemy URL; PostgreSQL as ``postgresql+psycopg://user@host:port/db``.
    database_url: str = f"sqlite:///{DEFAULT_SQLITE_PATH}"
    #: An admin token accepted without a database row (first login, automation).
    bootstrap_token: SecretStr | None = None
    bootstrap_token_file: Path | None = None
    #: A provisioner token accepted without a database row: the identity of the operator
    #: or of the local provisioner, the only one that registers nodes and writes shard status.
    provisioner_token: SecretStr | None = None
    provisioner_token_file: Path | None = None
    #: Create EmbeddingTable custom resources through the in-cluster API.
    kubernetes: bool = False
    kubernetes_namespace: str | None = None
    #: Run alembic migrations when the app is built (tests of migrations turn it off).
    migrate_on_start: bool = True
    #: Seconds to wait for a PS node's /metrics when the dashboard scrapes it.
    metrics_scrape_timeout: float = Field(default=2.0, gt=0)
    #: Mark the login cookie Secure (set behind TLS).
    secure_cookies: bool = False
    #: Largest request body accepted (bytes); larger ones get 413 before they are read,
    #: ahead of authentication (recstore.admin.body_limit).
    max_request_body_bytes: int = Field(default=16 << 20, gt=0)

    def resolved_bootstrap_token(self) -> str | None:
        """The bootstrap token from the variable, else from the file, else None."""
        return _secret(self.bootstrap_token, self.bootstrap_token_file)

    def resolved_provisioner_token(self) -> str | None:
        """The provisioner token from the variable, else from the file, else None."""
        return _secret(self.provisioner_token, self.provisioner_token_file)


def _secret(value: SecretStr | None, file: Path | None) -> str | None:
    if value is not None and value.get_secret_value():
        return value.get_secret_value()
    if file is not None:
        text = file.read_text().strip()
        return text or None
    return None
