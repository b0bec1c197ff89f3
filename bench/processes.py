"""What the benches that start PS node processes on loopback share: a free port,
the CPU time a process has run (every thread) and the JSON report, each defined once."""

from __future__ import annotations

import json
import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has run, all its threads (``/proc/PID/task/*/schedstat``:
    the scheduler's own accounting, finer than ``/proc/PID/stat``'s clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
            continue
    return total / 1e9


def write_report(path: Path, report: dict[str, object]) -> None:
    """The bench's JSON report at ``path`` (its folder made), and a line saying so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
