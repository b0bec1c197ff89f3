"""The local provisioner gives the nodes of inference tables the read-only token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from recstore.core import TableSpec
from recstore.local.provisioner import LocalProvisioner
from recstore.v1 import ps_pb2, ps_pb2_grpc

from .reporter_double import Statuses

ADMIN, READER = "node-admin-token", "node-reader-token"


def _token_file(path: Path, token: str) -> Path:
    path.write_text(token)
    path.chmod(0o600)
    return path


@pytest.fixture
def provisioned(tmp_path: Path) -> Iterator[tuple[LocalProvisioner, Statuses]]:
    statuses = Statuses()
    provisioner = LocalProvisioner(
        tmp_path / "state",
        statuses,
        auth_token_file=_token_file(tmp_path / "token", ADMIN),
        read_only_token_file=_token_file(tmp_path / "read-only-token", READER),
        poll_interval=0.1,
    )
    yield provisioner, statuses
    provisioner.close()


def _spec(name: str, mode: str) -> TableSpec:
    return TableSpec.model_validate(
        {"name": name, "num_embeddings": 100, "embedding_dim": 4, "mode": mode}
    )


def _call(endpoint: str, token: str, method: str, request: Any) -> grpc.StatusCode:
    with grpc.insecure_channel(endpoint) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        try:
            getattr(stub, method)(request, metadata=(("authorization", f"Bearer {token}"),))
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def test_inference_nodes_take_the_read_only_token_training_nodes_do_not(provisioned) -> None:
    provisioner, statuses = provisioned
    provisioner.create_table(_spec("serving", "inference"))
    provisioner.create_table(_spec("training", "training"))
    keys = np.arange(3, dtype="<i8").tobytes()
    values = np.ones((3, 4), "<f4").tobytes()
    for name, reader_pulls in (("serving", grpc.StatusCode.OK),
                               ("training", grpc.StatusCode.UNAUTHENTICATED)):  # fmt: skip
        (shard,) = statuses.wait_ready(name)["shards"]
        endpoint = shard["endpoint"]
        pull = ps_pb2.PullRequest(table=name, keys=keys)
        push = ps_pb2.PushRequest(table=name, keys=keys, values=values)
        assert _call(endpoint, ADMIN, "Push", push) == grpc.StatusCode.OK
        assert _call(endpoint, READER, "Pull", pull) == reader_pulls
        refused = grpc.StatusCode.PERMISSION_DENIED if name == "serving" else reader_pulls
        assert _call(endpoint, READER, "Push", push) == refused


def test_a_read_only_token_needs_the_auth_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs an auth token file"):
        LocalProvisioner(
            tmp_path, Statuses(), read_only_token_file=_token_file(tmp_path / "t", READER)
        )
