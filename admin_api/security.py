"""Bearer tokens: generation, hashing and roles.

Tokens are random 32-byte secrets, so a fast keyed hash is enough (no password
stretching needed): the database only ever holds SHA-256 digests, and the
comparison with the bootstrap token is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from enum import Enum

TOKEN_PREFIX = "rs_"
#: How many characters of a token are kept in clear to tell tokens apart.
DISPLAY_PREFIX_LEN = len(TOKEN_PREFIX) + 6


class Role(str, Enum):
    """Who may do what.

    viewer < editor < admin are ranked: each may do what the weaker ones may.
    ``provisioner`` stands outside that ladder: it is the identity of the
    platform's own provisioner (the operator, or the local one of ``recstore
    up``), the only one that registers PS nodes and writes shard status, i.e.
    the addresses trainers are sent to. Besides that it may only read. No
    human role, not even admin, writes shard status: a stolen editor or admin
    token cannot redirect trainers (or their tokens) to another address.
    """

    viewer = "viewer"
    editor = "editor"
    admin = "admin"
    provisioner = "provisioner"

    def allows(self, required: Role) -> bool:
        """Whether a principal with this role may do what ``required`` guards."""
        if required is Role.provisioner or self is Role.provisioner:
            return required in (self, Role.viewer)
        return _RANKS[self] >= _RANKS[required]


_RANKS = {Role.viewer: 0, Role.editor: 1, Role.admin: 2}


def generate_token() -> str:
    """A new secret: ``rs_`` + 32 random bytes, URL-safe base64."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Hex SHA-256 digest of a token, the only form that is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def display_prefix(token: str) -> str:
    return token[:DISPLAY_PREFIX_LEN]


def digests_match(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
