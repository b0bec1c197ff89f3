"""Construction, roles, backend selection and the native library."""

from __future__ import annotations

import pytest
import torch

from recstore import RecStoreClient as TopLevelClient
from recstore.client import RecStoreClient
from recstore.KVClient import RecStoreClient as DocumentedClient

from .conftest import unique_name


def test_import_paths_are_one_class() -> None:
    assert TopLevelClient is RecStoreClient is DocumentedClient


def test_one_instance_per_role() -> None:
    role = unique_name("role")
    first = RecStoreClient(role=role)
    try:
        assert RecStoreClient(role=role) is first
        other = RecStoreClient(role=unique_name("role"))
        assert other is not first and other.client_id != first.client_id
        assert first.role == role and isinstance(first.machine_id, int)
        assert isinstance(first.part_policy, dict)
        other.close()
    finally:
        first.close()
    assert RecStoreClient(role=role) is not first
    RecStoreClient(role=role).close()


def test_no_configuration_means_local(monkeypatch) -> None:
    monkeypatch.delenv("RECSTORE_PS_ENDPOINTS", raising=False)
    monkeypatch.delenv("RECSTORE_ADMIN_URL", raising=False)
    client = RecStoreClient(role=unique_name("role"))
    try:
        assert client.backend == "local"
    finally:
        client.close()


def test_environment_selects_grpc(monkeypatch, ps_endpoints) -> None:
    monkeypatch.setenv("RECSTORE_PS_ENDPOINTS", ",".join(ps_endpoints))
    client = RecStoreClient(role=unique_name("role"))
    try:
        assert client.backend == "grpc" and client.ops is not None
        assert client.ops.endpoints == tuple(ps_endpoints)  # type: ignore[attr-defined]
        name = unique_name()
        client.init_data(name, (10, 2), torch.float32)
        assert client.pull(name, torch.tensor([3])).shape == (1, 2)
        client.delete_data(name)
    finally:
        client.close()


def test_set_ps_config_reconnects_to_one_node(local_client, ps_endpoints) -> None:
    host, port = ps_endpoints[0].rsplit(":", 1)
    with pytest.raises(ValueError):
        local_client.set_ps_config(host, "not a port")
    assert local_client.backend == "local"  # a rejected call changes nothing
    local_client.set_ps_config(host, int(port))
    assert local_client.backend == "grpc" and local_client.ops.endpoints == (ps_endpoints[0],)


def test_grpc_backend_without_endpoints_says_so(local_client) -> None:
    local_client.set_ps_backend("grpc")
    with pytest.raises(RuntimeError, match="no PS endpoints"):
        local_client.init_data(unique_name(), (4, 4), torch.float32)
    with pytest.raises(ValueError, match="unknown backend"):
        local_client.set_ps_backend("redis")
    local_client.set_ps_backend("local")
    assert local_client.backend == "local"


def test_unreachable_node_is_a_runtime_error_with_the_reason(local_client) -> None:
    local_client.set_ps_endpoints(["127.0.0.1:1"])
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        local_client.init_data(unique_name(), (4, 4), torch.float32)


def test_bad_library_path_is_an_import_error(tmp_path) -> None:
    with pytest.raises(ImportError, match="no such file"):
        RecStoreClient(library_path=str(tmp_path / "missing.so"), role=unique_name("role"))
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not a shared object")
    with pytest.raises(ImportError):
        RecStoreClient(library_path=str(garbage), role=unique_name("role"))


def test_installed_native_library_path_loads() -> None:
    import recstore._native as native

    client = RecStoreClient(library_path=native.__file__, role=unique_name("role"))
    name = unique_name()
    client.init_data(name, (4, 2), torch.float32, init_func=lambda s, d: torch.ones(s, dtype=d))
    assert torch.equal(client.pull(name, torch.tensor([0, 3])), torch.ones(2, 2))
    client.delete_data(name)
    client.close()


def test_learning_rate_is_validated(local_client) -> None:
    with pytest.raises(ValueError):
        local_client.set_learning_rate(0.0)
    assert local_client.learning_rate == 0.01
