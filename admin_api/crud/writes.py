"""Flushing and committing catalogue writes, so every resource turns a lost race into one error.

Operations flush but do not commit: the route commits once the provisioner has
accepted the change, so a refused change leaves nothing behind. A write that
lost a race with another one fails at flush with VersionConflict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from recstore.admin.errors import VersionConflict

T = TypeVar("T")
#: reads and writes of a request without a version of its own, before a race is answered
RACE_TRIES = 3


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


def against_newest(session: Session, expected: int | None, attempt: Callable[[], T]) -> T:
    """Run ``attempt`` (read the resource, write it, flush). A request naming no version
    is taken against the newest one: a write that lost a race (to the provisioner's status
    reports, say) reads again and retries; one naming a stale version answers 409."""
    for left in reversed(range(RACE_TRIES)):
        try:
            return attempt()
        except VersionConflict:
            if expected is not None or left == 0:
                raise
            session.expire_all()
    raise AssertionError("unreachable")
