"""Shard ports are picked below the kernel's ephemeral range, and only free ones.

A restarted shard listens on its saved port again; a port from the ephemeral
range can meanwhile be any outgoing connection's local port, and the node then
never comes back (seen: "Address already in use" on every restart).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from recstore.local import ports


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32768\t60999\n", (32768, 60999)),
        ("1024 65535", (1024, 65535)),
        ("garbage", ports.EPHEMERAL_DEFAULT),
        (None, ports.EPHEMERAL_DEFAULT),  # no such file (not Linux)
    ],
)
def test_the_ephemeral_range_is_read_or_defaults(
    tmp_path: Path, text: str | None, expected: tuple[int, int]
) -> None:
    path = tmp_path / "ip_local_port_range"
    if text is not None:
        path.write_text(text)
    assert ports.ephemeral_range(path) == expected


@pytest.mark.parametrize(("low", "count"), [(32768, ports.TRIES), (10_010, 10), (9_000, 0)])
def test_candidates_lie_between_the_floor_and_the_ephemeral_range(low: int, count: int) -> None:
    picked = ports.candidates(low)
    assert len(picked) == count == len(set(picked))
    assert all(ports.PORT_FLOOR <= port < low for port in picked)


def test_a_picked_port_is_free_and_below_the_ephemeral_range() -> None:
    port = ports.free_port()
    assert ports.PORT_FLOOR <= port < ports.ephemeral_range()[0]
    assert ports.bindable(port)


def test_a_taken_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert not ports.bindable(busy)
        other = next(p for p in range(20_000, 30_000) if ports.bindable(p))
        monkeypatch.setattr(ports, "_handed_out", set())
        monkeypatch.setattr(ports, "candidates", lambda low: [busy, other])
        assert ports.free_port() == other


def test_with_no_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "candidates", lambda low: [])
    port = ports.free_port()
    assert port > 0 and ports.bindable(port)


def test_a_port_is_never_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # every pick sees the same free candidate first: a table's ports picked before any
    # of its nodes listens (the shard that lost the race never started)
    port = next(p for p in range(20_000, 30_000) if ports.bindable(p))
    second = next(p for p in range(port + 1, 30_000) if ports.bindable(p))
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "candidates", lambda low: [port, second])
    assert [ports.free_port(), ports.free_port()] == [port, second]
    third = ports.free_port()  # the candidates are spent: the kernel's pick, a new port
    assert third not in (port, second) and ports.bindable(third)


def test_a_claimed_port_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    port = next(p for p in range(20_000, 30_000) if ports.bindable(p))
    second = next(p for p in range(port + 1, 30_000) if ports.bindable(p))
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "candidates", lambda low: [port, second])
    ports.claim([port])  # a saved table's port, its node not listening yet
    assert ports.free_port() == second
