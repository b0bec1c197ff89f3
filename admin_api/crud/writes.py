"""Flushing and committing catalogue writes, so every resource turns a lost race into one error.

Operations flush but do not commit: the route commits once the provisioner has
accepted the change, so a refused change leaves nothing behind. A write that
lost a race with another one fails at flush with VersionConflict.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from recstore.admin.errors import VersionConflict


@contextmanager
def writes(session: Session, *, on_duplicate: Exception | None = None) -> Iterator[None]:
    """Flush, turning a lost race into VersionConflict (or ``on_duplicate`` for a unique key)."""
    try:
        yield
        session.flush()
    except StaleDataError as exc:
        session.rollback()
        raise VersionConflict("the resource was changed concurrently; read it again") from exc
    except IntegrityError as exc:
        session.rollback()
        raise (on_duplicate or VersionConflict(f"conflicting write: {exc.orig}")) from exc


def commit(session: Session) -> None:
    with writes(session):
        session.commit()
