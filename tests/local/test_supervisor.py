"""The supervisor restarts a killed process and stops processes for good on request."""

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from recstore.local.supervisor import ProcessSpec, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killed_process_is_restarted_with_same_argv(tmp_path: Path) -> None:
    restarted: list[tuple[str, int]] = []
    restarted_once = threading.Event()

    def on_restart(name: str, count: int) -> None:
        restarted.append((name, count))
        restarted_once.set()

    supervisor = Supervisor(poll_interval=0.02, on_restart=on_restart)
    try:
        first = supervisor.start(ProcessSpec("node-0", SLEEPER, tmp_path / "node-0.log"))
        os.kill(first, signal.SIGKILL)
        assert restarted_once.wait(60)
        assert supervisor.pid("node-0") != first
        assert _alive(supervisor.pid("node-0"))
        assert supervisor.restarts("node-0") == 1
        assert restarted == [("node-0", 1)]
    finally:
        supervisor.stop_all(timeout=5)


def test_stopped_process_stays_stopped(tmp_path: Path) -> None:
    supervisor = Supervisor(poll_interval=0.02)
    try:
        pid = supervisor.start(ProcessSpec("node-0", SLEEPER, tmp_path / "n.log"))
        code = supervisor.stop("node-0", timeout=5)
        assert code == -signal.SIGTERM
        assert not _alive(pid) and supervisor.names() == []
        assert supervisor.stop("node-0") is None
    finally:
        supervisor.stop_all(timeout=5)


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    supervisor = Supervisor(poll_interval=0.02)
    try:
        supervisor.start(ProcessSpec("a", SLEEPER, tmp_path / "a.log"))
        with pytest.raises(ValueError, match="already supervised"):
            supervisor.start(ProcessSpec("a", SLEEPER, tmp_path / "a.log"))
    finally:
        supervisor.stop_all(timeout=5)


def test_a_restart_names_why_the_process_exited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failing = [sys.executable, "-c", "raise RuntimeError('Failed to bind to address 127.0.0.1:1')"]
    restarted = threading.Event()
    supervisor = Supervisor(poll_interval=0.02, on_restart=lambda name, count: restarted.set())
    try:
        with caplog.at_level("WARNING", logger="recstore.local.supervisor"):
            supervisor.start(ProcessSpec("node-0", failing, tmp_path / "node-0.log"))
            assert restarted.wait(60)
    finally:
        supervisor.stop_all(timeout=5)
    assert "its log ends: RuntimeError: Failed to bind to address 127.0.0.1:1" in caplog.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a\nb\n\n  \n", "b"), ("", ""), ("x" * 5000 + "\nlast", "last"), (None, "")],
)
def test_the_last_log_line(tmp_path: Path, text: str | None, expected: str) -> None:
    from recstore.local.supervisor import last_line

    path = tmp_path / "node.log"
    if text is not None:
        path.write_text(text)
    assert last_line(path) == expected
