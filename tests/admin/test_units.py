"""Pure pieces, by parameter tables: spec patches, roles, bearer and version parsing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import HTTPException
from pydantic import ValidationError

from recstore.admin.api.deps import parse_version
from recstore.admin.schemas import TablePatch
from recstore.admin.security import (
    Role,
    digests_match,
    generate_token,
    hash_token,
    parse_bearer,
)
from recstore.admin.spec_patch import apply_patch, normalise_keys
from recstore.core import TableSpec
from recstore.core.errors import InvalidArgument
from recstore.core.status import validate_endpoint

BASE = TableSpec(name="t", num_embeddings=100, embedding_dim=8, shards=2)


@pytest.mark.parametrize(
    ("changes", "check"),
    [
        ({"shards": 4}, lambda s: s.shards == 4),
        ({"numEmbeddings": 500}, lambda s: s.num_embeddings == 500),
        (
            {"optimizer": {"kind": "adam", "beta1": 0.5}},
            lambda s: (s.optimizer.kind, s.optimizer.beta1, s.optimizer.lr) == ("adam", 0.5, 0.01),
        ),
        ({"optimizer": {"weightDecay": 0.1}}, lambda s: s.optimizer.weight_decay == 0.1),
        (
            {"checkpoint": {"interval_seconds": 30, "keep": 5}},
            lambda s: (s.checkpoint.interval_seconds, s.checkpoint.keep) == (30, 5),
        ),
        ({"storage": "gpu"}, lambda s: s.storage == "gpu"),
        ({"nonFinite": "skip-rows"}, lambda s: s.non_finite == "skip-rows"),
        ({"transportDtype": "float16"}, lambda s: s.transport_dtype == "float16"),
        ({"mode": "training"}, lambda s: s == BASE),  # unchanged: accepted
        ({"optimizer": None}, lambda s: s.optimizer == TableSpec.model_fields["optimizer"].default),
        ({}, lambda s: s == BASE),
    ],
)
def test_apply_patch(changes: dict[str, Any], check: Any) -> None:
    assert check(apply_patch(BASE, changes))


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"embedding_dim": 16}, InvalidArgument),
        ({"dtype": "bfloat16"}, InvalidArgument),
        ({"name": "u"}, InvalidArgument),
        ({"keys": {"mode": "hashed"}}, InvalidArgument),
        ({"mode": "inference"}, InvalidArgument),
        ({"shards": 0}, ValidationError),
        ({"initializer": {"kind": "uniform", "low": 2, "high": 1}}, ValidationError),
        ({"optimizer": {"nesterov": True}}, ValidationError),
        ({"num_embeddings": None}, ValidationError),
    ],
)
def test_apply_patch_rejects(changes: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        apply_patch(BASE, changes)


def test_normalise_keys_recurses_and_keeps_unknown() -> None:
    got = normalise_keys(
        TableSpec, {"embeddingDim": 1, "optimizer": {"weightDecay": 1}, "mystery": {"aB": 1}}
    )
    assert got == {"embedding_dim": 1, "optimizer": {"weight_decay": 1}, "mystery": {"aB": 1}}


@pytest.mark.parametrize(
    ("role", "required", "allowed"),
    [
        (Role.viewer, Role.viewer, True),
        (Role.viewer, Role.editor, False),
        (Role.editor, Role.editor, True),
        (Role.editor, Role.admin, False),
        (Role.admin, Role.viewer, True),
        (Role.admin, Role.admin, True),
        # The provisioner stands apart: it reads, and it alone writes what it guards.
        (Role.provisioner, Role.viewer, True),
        (Role.provisioner, Role.provisioner, True),
        (Role.provisioner, Role.editor, False),
        (Role.provisioner, Role.admin, False),
        (Role.admin, Role.provisioner, False),
        (Role.editor, Role.provisioner, False),
    ],
)
def test_role_order(role: Role, required: Role, allowed: bool) -> None:
    assert role.allows(required) is allowed


def test_tokens_are_random_and_hashes_stable() -> None:
    a, b = generate_token(), generate_token()
    assert a != b and a.startswith("rs_") and len(a) >= 43
    assert hash_token(a) == hash_token(a) != hash_token(b)
    assert digests_match(hash_token(a), hash_token(a)) and not digests_match(hash_token(a), "0")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_bearer(header: str | None, token: str | None) -> None:
    assert parse_bearer(header) == token


@pytest.mark.parametrize(
    ("value", "version"),
    [('"3"', 3), ("3", 3), ('W/"12"', 12), (7, 7), ("*", None), (None, None)],
)
def test_parse_version(value: str | int | None, version: int | None) -> None:
    assert parse_version(value, "If-Match") == version


@pytest.mark.parametrize("value", ["abc", '"-1"', "1.5", ""])
def test_parse_version_rejects(value: str) -> None:
    with pytest.raises(HTTPException) as info:
        parse_version(value, "If-Match")
    assert info.value.status_code == 422


@pytest.mark.parametrize(
    ("endpoint", "ok"),
    [
        ("127.0.0.1:50051", True),
        ("ps-0.ps.ns.svc:50051", True),
        ("[::1]:80", True),
        ("host", False),
        ("host:0", False),
        ("host:65536", False),
        (":80", False),
        ("a b:80", False),
        ("http://h:80", False),
        ("host:80\n", False),  # "$" alone would let a final newline by
    ],
)
def test_validate_endpoint(endpoint: str, ok: bool) -> None:
    if ok:
        assert validate_endpoint(endpoint) == endpoint
    else:
        with pytest.raises(ValueError, match="host:port"):
            validate_endpoint(endpoint)


def test_a_patch_names_every_spec_field() -> None:
    """Each field a table spec has can be sent in a PATCH: the change then meets the
    spec's own rules (accepted, immutable, or refused by the provisioner), never an
    'extra input' error."""
    assert set(TableSpec.model_fields) == set(TablePatch.model_fields) - {"resource_version"}
