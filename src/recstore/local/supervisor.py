"""Keeps local processes alive: start, watch, restart on crash, stop on request.

The local provisioner runs one PS node process per shard; when one dies (a
crash, an OOM kill, a `kill -9` in a test) this restarts it with the same
arguments and port, so clients keep their endpoints and the node restores its
shard from its data directory. Pure process management: no gRPC, no tables.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class ProcessSpec:
    """How to run one supervised process."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Supervised:
    spec: ProcessSpec
    process: subprocess.Popen[bytes]
    restarts: int = 0
    stopping: bool = False
    last_start: float = field(default_factory=time.monotonic)


class Supervisor:
    """Runs processes and restarts any that exit while they should be running.

    Restarts back off exponentially (up to ``max_backoff`` seconds) when a
    process keeps dying soon after starting, so a broken configuration does
    not spin the machine.
    """

    def __init__(
        self,
        *,
        poll_interval: float = 0.2,
        max_backoff: float = 10.0,
        on_restart: Callable[[str, int], None] | None = None,
    ) -> None:
        self._poll_interval = poll_interval
        self._max_backoff = max_backoff
        self._on_restart = on_restart
        self._procs: dict[str, _Supervised] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def start(self, spec: ProcessSpec) -> int:
        """Start a process under this name (replacing nothing); returns its pid."""
        with self._lock:
            if spec.name in self._procs:
                raise ValueError(f"a process named {spec.name!r} is already supervised")
            supervised = _Supervised(spec, _spawn(spec))
            self._procs[spec.name] = supervised
            return supervised.process.pid

    def pid(self, name: str) -> int:
        with self._lock:
            return self._procs[name].process.pid

    def restarts(self, name: str) -> int:
        with self._lock:
            return self._procs[name].restarts

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._procs)

    def stop(self, name: str, *, timeout: float = 30.0) -> int | None:
        """SIGTERM the process, wait up to ``timeout``, then SIGKILL; returns its exit code."""
        with self._lock:
            supervised = self._procs.pop(name, None)
        if supervised is None:
            return None
        supervised.stopping = True
        return _terminate(supervised.process, timeout)

    def stop_all(self, *, timeout: float = 30.0) -> None:
        self._stop.set()
        with self._lock:
            procs = list(self._procs.values())
            self._procs.clear()
        for supervised in procs:
            supervised.stopping = True
            if supervised.process.poll() is None:
                supervised.process.send_signal(signal.SIGTERM)
        for supervised in procs:
            _terminate(supervised.process, timeout)
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_interval):
            with self._lock:
                for supervised in self._procs.values():
                    code = supervised.process.poll()
                    if code is None or supervised.stopping:
                        continue
                    uptime = time.monotonic() - supervised.last_start
                    backoff = min(self._max_backoff, 0.5 * 2 ** min(supervised.restarts, 6))
                    if uptime < backoff:
                        continue  # died young: wait out the backoff before restarting
                    log.warning(
                        "process %s exited with %s; restarting (its log ends: %s)",
                        supervised.spec.name, code, last_line(supervised.spec.log_path),
                    )  # fmt: skip
                    supervised.process = _spawn(supervised.spec)
                    supervised.restarts += 1
                    supervised.last_start = time.monotonic()
                    if self._on_restart is not None:
                        self._on_restart(supervised.spec.name, supervised.restarts)


def last_line(path: Path, tail_bytes: int = 4096) -> str:
    """The last non-empty line of a process's log (why it exited, usually), or ''."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _spawn(spec: ProcessSpec) -> subprocess.Popen[bytes]:
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(spec.log_path, "ab") as log_file:
        return subprocess.Popen(
            list(spec.argv),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **spec.env},
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the nodes
        )


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
