"""What one running app holds: settings, database, provisioner, metrics registry."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from recstore.admin.provisioning import Provisioner
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
