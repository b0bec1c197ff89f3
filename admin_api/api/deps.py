"""Dependencies: sessions, the calling principal and role checks, as Annotated aliases.

Authentication reads ``Authorization: Bearer <token>``; the dashboard's pages
also accept the same token from their login cookie. 401 means no or an unknown
token, 403 a role too weak for the route.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from recstore.admin import crud
from recstore.admin.context import AppContext
from recstore.admin.provisioning import Provisioner
from recstore.admin.security import Role, digests_match, hash_token

BOOTSTRAP_ACTOR = "bootstrap-admin"
BOOTSTRAP_PROVISIONER = "bootstrap-provisioner"

_bearer = HTTPBearer(auto_error=False, description="An API token: `Authorization: Bearer rs_...`")


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role
    token_id: int | None = None

    @property
    def actor(self) -> str:
        """How the audit log names this principal."""
        name = self.name if self.token_id is None else f"{self.name} (token {self.token_id})"
        return name[:255]


def get_context(request: Request) -> AppContext:
    context: AppContext = request.app.state.context
    return context


ContextDep = Annotated[AppContext, Depends(get_context)]


def get_session(context: ContextDep) -> Iterator[Session]:
    with context.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def get_provisioner(context: ContextDep) -> Provisioner:
    return context.provisioner


ProvisionerDep = Annotated[Provisioner, Depends(get_provisioner)]


def principal_for(secret: str, context: AppContext, session: Session) -> Principal | None:
    """The principal a secret authenticates, or None."""
    return principal_for_digest(hash_token(secret), context, session)


def principal_for_digest(digest: str, context: AppContext, session: Session) -> Principal | None:
    """The principal of the token whose SHA-256 is ``digest`` (a dashboard session keeps it)."""
    if context.bootstrap_hash is not None and digests_match(digest, context.bootstrap_hash):
        return Principal(name=BOOTSTRAP_ACTOR, role=Role.admin)
    if context.provisioner_hash is not None and digests_match(digest, context.provisioner_hash):
        return Principal(name=BOOTSTRAP_PROVISIONER, role=Role.provisioner)
    token = crud.active_token(session, digest=digest)
    if token is None:
        return None
    return Principal(name=token.name, role=Role(token.role), token_id=token.id)


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail=message,
        headers={"WWW-Authenticate": "Bearer"},
    )


def get_principal(
    context: ContextDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized("missing bearer token (Authorization: Bearer <token>)")
    principal = principal_for(credentials.credentials, context, session)
    if principal is None:
        raise _unauthorized("invalid or revoked token")
    return principal


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


def forbidden_message(required: Role, held: Role) -> str | None:
    """Why a principal holding ``held`` may not do what ``required`` guards (None: it may)."""
    if held.allows(required):
        return None
    if required is Role.provisioner:
        return (
            "only the provisioner identity (the operator or the local provisioner) registers "
            f"PS nodes and writes shard status; the token has the {held.value} role"
        )
    return f"this operation needs the {required.value} role; the token has {held.value}"


def require_role(required: Role) -> Callable[[Principal], Principal]:
    def check(principal: CurrentPrincipal) -> Principal:
        message = forbidden_message(required, principal.role)
        if message is not None:
            raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail=message)
        return principal

    return check


ViewerDep = Annotated[Principal, Depends(require_role(Role.viewer))]
EditorDep = Annotated[Principal, Depends(require_role(Role.editor))]
AdminDep = Annotated[Principal, Depends(require_role(Role.admin))]
ProvisionerRoleDep = Annotated[Principal, Depends(require_role(Role.provisioner))]


def expected_version(if_match: str | None, resource_version: str | int | None) -> int | None:
    """The version a change is made against: ``If-Match``, else the body's resourceVersion."""
    expected = parse_version(if_match, "If-Match")
    return expected if expected is not None else parse_version(resource_version, "resourceVersion")


def parse_version(value: str | int | None, source: str) -> int | None:
    """A resourceVersion from If-Match (``"3"``, ``W/"3"``, ``3``, ``*``) or a body field."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if text == "*":
        return None
    text = text.removeprefix("W/").strip('"')
    if not text.isdigit():
        raise HTTPException(
            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=f'{source} must be a resourceVersion such as "3", got {value!r}',
        )
    return int(text)
