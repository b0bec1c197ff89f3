"""What one running app holds: settings, database, provisioner, metrics registry."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from recstore.admin.provisioning import Provisioner
from recstore.admin.security import hash_token
from recstore.admin.settings import Settings


@dataclass
class AppContext:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    provisioner: Provisioner
    #: SHA-256 of the bootstrap admin token, if one is configured.
    bootstrap_hash: str | None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    #: SHA-256 of the configured provisioner token, if any (read from the settings).
    provisioner_hash: str | None = field(init=False)

    def __post_init__(self) -> None:
        secret = self.settings.resolved_provisioner_token()
        self.provisioner_hash = hash_token(secret) if secret else None
