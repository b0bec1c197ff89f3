"""API tokens (admin only): create (the secret is shown once), list, revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, status

from recstore.admin import crud
from recstore.admin.api.deps import AdminDep, SessionDep
from recstore.admin.json_body import StrictJsonRoute
from recstore.admin.schemas import Page, TokenCreate, TokenCreated, TokenPublic

router = APIRouter(prefix="/tokens", tags=["tokens"], route_class=StrictJsonRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TokenCreated)
def create_token(body: TokenCreate, session: SessionDep, principal: AdminDep) -> TokenCreated:
    token, secret = crud.create_token(
        session, name=body.name, role=body.role, actor=principal.actor
    )
    crud.commit(session)
    return TokenCreated(**TokenPublic.model_validate(token).model_dump(), token=secret)


@router.get("", response_model=Page[TokenPublic])
def list_tokens(
    session: SessionDep,
    _: AdminDep,
    include_revoked: bool = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[TokenPublic]:
    items, total = crud.list_tokens(
        session, include_revoked=include_revoked, limit=limit, offset=offset
    )
    return Page(
        items=[TokenPublic.model_validate(t) for t in items],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_token(
    token_id: Annotated[int, Path(ge=1, le=2**31 - 1)], session: SessionDep, principal: AdminDep
) -> None:
    """Revoke a token; revoking an already revoked one changes nothing."""
    crud.revoke_token(session, token_id=token_id, actor=principal.actor)
    crud.commit(session)
