"""Clients for the SDK tests: the local backend, and gRPC to two in-thread PS nodes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from recstore.client import RecStoreClient
from recstore.client.remote.updates import CARRY_ENV


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def ps_endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two PS nodes (shards 0 and 1 of 2) on loopback, shared by the session."""
    from recstore.ps.serve.server import start_in_thread

    handles = [
        start_in_thread(
            "127.0.0.1",
            0,
            data_dir=tmp_path_factory.mktemp(f"ps{index}"),
            shard_index=index,
            num_shards=2,
        )
        for index in range(2)
    ]
    yield [handle.address for handle in handles]
    for handle in handles:
        handle.stop()


def _client(backend: str, endpoints: list[str] | None) -> RecStoreClient:
    client = RecStoreClient(role=unique_name("role"))
    if backend == "grpc":
        assert endpoints is not None
        client.set_ps_endpoints(endpoints)
    else:
        client.set_ps_backend("local")
    return client


@pytest.fixture
def local_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecStoreClient]:
    for variable in ("RECSTORE_PS_ENDPOINTS", "RECSTORE_ADMIN_URL"):
        monkeypatch.delenv(variable, raising=False)
    client = _client("local", None)
    yield client
    for name in client.data_name_list():
        client.delete_data(name)
    client.close()


#: a carry delay no test outlasts: held updates go only when taken or released, so a
#: test's sequence of requests does not depend on how fast the machine runs it (the
#: timer itself is tested with a short delay, synchronised on the send it makes)
HELD_UNTIL_TAKEN_MS = str(3_600_000)


@pytest.fixture
def grpc_client(
    ps_endpoints: list[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RecStoreClient]:
    monkeypatch.setenv(CARRY_ENV, HELD_UNTIL_TAKEN_MS)
    client = _client("grpc", ps_endpoints)
    yield client
    for name in client.data_name_list():
        client.delete_data(name)
    client.close()


@pytest.fixture(params=["local", "grpc"])
def any_client(request: pytest.FixtureRequest) -> RecStoreClient:
    """The same test against both backends."""
    fixture = "local_client" if request.param == "local" else "grpc_client"
    return request.getfixturevalue(fixture)
