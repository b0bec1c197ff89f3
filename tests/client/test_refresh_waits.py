"""A slot-map refresh waits out a restart of the admin API instead of failing the call:
the refused keys were not applied, so they can wait for the map (a platform killed and
started again mid-move), for a bounded time."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from recstore.client.errors import BackendError
from recstore.client.remote.backend import GrpcBackend
from recstore.client.remote.tables import Discovery
from recstore.core import SlotMap


def _backend(outcomes: list[BackendError | Discovery]) -> GrpcBackend:
    backend = GrpcBackend(admin_url="http://127.0.0.1:9")
    backend._tables["t"] = SimpleNamespace(endpoints=())  # type: ignore[assignment]

    def discover(name: str) -> Discovery:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BackendError):
            raise outcome
        return outcome

    backend._discover = discover  # type: ignore[method-assign]
    return backend


def test_a_refresh_waits_for_the_admin_api_to_come_back() -> None:
    moved = SlotMap(epoch=2, ranges=SlotMap.initial(2).ranges)
    down = BackendError("admin API unreachable", code=grpc.StatusCode.UNAVAILABLE)
    outcomes: list[BackendError | Discovery] = [
        down,
        down,
        down,
        Discovery(None, ("a:1", "b:2"), moved),
    ]
    assert _backend(outcomes)._refresh("t", 2) == moved
    assert outcomes == []


def test_a_refresh_refused_by_the_admin_api_fails_at_once() -> None:
    refused = BackendError("forbidden", code="HTTP_403")
    outcomes: list[BackendError | Discovery] = [refused]
    with pytest.raises(BackendError, match="forbidden"):
        _backend(outcomes)._refresh("t", 2)
