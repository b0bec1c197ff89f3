"""Loopback ports for the local platform's shards, picked where no client takes them.

A shard keeps its ports across restarts of `recstore up` (``ports.json``), so
its endpoint stays the one trainers and the catalogue know. A port the kernel
handed out from its ephemeral range (``bind(0)``) can be taken while the
platform is down, or between a node's stop and its restart, by an outgoing
connection's local port: any process's client. The restarted node then cannot
listen ("Address already in use") and its supervisor restarts it on the same
port, forever. Ports are therefore picked below the ephemeral range, where the
kernel never places a connection's local port, and checked free when picked.

A free port is not held until its node listens, so two picks before any node
starts (a table's grpc and metrics ports, its shards', a second table's) could
return the same port, and the node that loses the race never starts. A process
therefore never hands out a port twice.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

#: the lowest port picked (below it: well-known and registered services)
PORT_FLOOR = 10_000
#: the kernel's ephemeral range, where it is not readable (Linux's default)
EPHEMERAL_DEFAULT = (32768, 60999)
#: a random sample of candidates tried before falling back to the kernel's pick
TRIES = 64

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")

#: every port this process has handed out (a few per shard it ever ran)
_handed_out: set[int] = set()
_lock = threading.Lock()


def ephemeral_range(path: Path = _RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (``ip_local_port_range``)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return low, high


def bindable(port: int) -> bool:
    """Whether a listener could bind ``port`` on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def candidates(low: int, floor: int = PORT_FLOOR) -> list[int]:
    """Ports to try, in random order (several platforms may pick at once): from the floor
    to just below the ephemeral range; none when that range starts below the floor."""
    span = range(floor, low)
    return random.sample(span, min(TRIES, len(span))) if len(span) > 0 else []


def free_port() -> int:
    """A free loopback port below the ephemeral range, else one the kernel picks; never
    one this process handed out before."""
    with _lock:
        port = _pick()
        _handed_out.add(port)
        return port


def claim(ports: list[int]) -> None:
    """Ports a table listened on before (``ports.json``): never handed out to another."""
    with _lock:
        _handed_out.update(ports)


def _pick() -> int:
    for port in candidates(ephemeral_range()[0]):
        if port not in _handed_out and bindable(port):
            return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            return port
