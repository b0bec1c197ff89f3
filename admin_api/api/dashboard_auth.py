"""Who is using the dashboard, and whether a form post really comes from its own pages.

A session cookie (HttpOnly, SameSite=Strict) names a server-side session; every
state-changing form carries that session's CSRF token in a hidden field, and a
post whose Origin (or Referer) is another site is refused before anything runs.
Both answer 403 and change nothing.
"""

from __future__ import annotations

import hmac
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request, status

from recstore.admin.api.deps import ContextDep, Principal, SessionDep, principal_for_digest
from recstore.admin.crud.dashboard_sessions import find_session

SESSION_COOKIE = "recstore_session"
CSRF_FIELD = "csrf_token"


class LoginRequired(Exception):
    """No live session: the dashboard answers with a redirect to its login page."""


def _host_of(url: str) -> str | None:
    return urlsplit(url).netloc.lower() or None


def check_same_origin(request: Request) -> None:
    """403 when the browser says the post comes from another host (and port).

    Browsers send Origin with every form post (Referer where an old one does
    not); a client that sends neither is no browser and still needs the token.
    The scheme is not compared: behind a TLS-terminating proxy the service
    sees http while the browser says https.
    """
    own = request.headers.get("host", "").lower()
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if claimed is not None and _host_of(claimed) != own:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"cross-origin form post refused (origin {claimed})"
        )


def ui_principal(request: Request, context: ContextDep, session: SessionDep) -> Principal:
    """The principal of the session cookie; keeps the session's CSRF token for the page."""
    secret = request.cookies.get(SESSION_COOKIE)
    row = find_session(session, secret=secret) if secret else None
    principal = principal_for_digest(row.token_hash, context, session) if row else None
    if row is None or principal is None:
        raise LoginRequired
    request.state.csrf_token = row.csrf_token
    return principal


UiPrincipal = Annotated[Principal, Depends(ui_principal)]


async def ui_form_principal(request: Request, principal: UiPrincipal) -> Principal:
    """The principal of a state-changing form post, once its origin and CSRF token check out."""
    check_same_origin(request)
    sent = (await request.form()).get(CSRF_FIELD)
    expected: str = request.state.csrf_token
    if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "the form's CSRF token is missing or wrong: reload the page and submit it again",
        )
    return principal


UiFormPrincipal = Annotated[Principal, Depends(ui_form_principal)]
