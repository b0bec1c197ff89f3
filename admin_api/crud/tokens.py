"""API token operations behind ``routes/tokens.py``, and the lookup that authenticates a request."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from recstore.admin import views
from recstore.admin.crud import audit
from recstore.admin.crud.paging import page
from recstore.admin.crud.writes import writes
from recstore.admin.errors import NotFound
from recstore.admin.models import TokenRecord, utcnow
from recstore.admin.security import Role, display_prefix, generate_token, hash_token

#: How stale a token's last_used_at may get before a request refreshes it.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def create_token(session: Session, *, name: str, role: Role, actor: str) -> tuple[TokenRecord, str]:
    """A new token and its secret (the secret is not stored and cannot be shown again)."""
    secret = generate_token()
    token = TokenRecord(
        name=name,
        role=role.value,
        token_hash=hash_token(secret),
        prefix=display_prefix(secret),
        created_by=actor,
    )
    with writes(session):
        session.add(token)
    audit.record(session, actor, "token.create", resource=name, after=views.token_snapshot(token))
    return token, secret


def list_tokens(
    session: Session, *, include_revoked: bool, limit: int, offset: int
) -> tuple[list[TokenRecord], int]:
    query = select(TokenRecord).order_by(TokenRecord.id)
    if not include_revoked:
        query = query.where(TokenRecord.revoked_at.is_(None))
    return page(session, query, limit=limit, offset=offset)


def revoke_token(session: Session, *, token_id: int, actor: str) -> TokenRecord:
    token = session.get(TokenRecord, token_id)
    if token is None:
        raise NotFound(f"token {token_id} not found")
    if token.revoked_at is not None:
        return token
    before = views.token_snapshot(token)
    with writes(session):
        token.revoked_at = utcnow()
    audit.record(
        session,
        actor,
        "token.revoke",
        resource=token.name,
        before=before,
        after=views.token_snapshot(token),
    )
    return token


def active_token(session: Session, *, digest: str) -> TokenRecord | None:
    """The unrevoked token whose hash is ``digest``; refreshes its last use."""
    token = session.scalar(select(TokenRecord).where(TokenRecord.token_hash == digest))
    if token is None or token.revoked_at is not None:
        return None
    now = utcnow()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        token.last_used_at = now
        session.commit()
    return token
