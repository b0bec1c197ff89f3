"""Dashboard sessions: a login creates a row, logout deletes it, expiry ends it.

The cookie carries a random secret that is not an API token; the database
holds its digest only, next to the digest of the token that logged in (so
the request can re-check that token) and the session's CSRF token.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from recstore.admin.models import DashboardSession, utcnow
from recstore.admin.security import hash_token

SESSION_LIFETIME = timedelta(hours=12)


def start_session(session: Session, *, token_digest: str) -> tuple[DashboardSession, str]:
    """A new session for the token whose digest is given, and the cookie's secret."""
    now = utcnow()
    session.execute(delete(DashboardSession).where(DashboardSession.expires_at <= now))
    secret = secrets.token_urlsafe(32)
    row = DashboardSession(
        session_hash=hash_token(secret),
        token_hash=token_digest,
        csrf_token=secrets.token_urlsafe(32),
        created_at=now,
        expires_at=now + SESSION_LIFETIME,
    )
    session.add(row)
    session.commit()
    return row, secret


def find_session(session: Session, *, secret: str) -> DashboardSession | None:
    """The live session a cookie's secret names, or None (unknown, ended or expired)."""
    row = session.scalar(
        select(DashboardSession).where(DashboardSession.session_hash == hash_token(secret))
    )
    if row is None or row.expires_at <= utcnow():
        return None
    return row


def end_session(session: Session, *, secret: str) -> None:
    """Delete the session: the cookie stops working, even when replayed."""
    session.execute(
        delete(DashboardSession).where(DashboardSession.session_hash == hash_token(secret))
    )
    session.commit()
