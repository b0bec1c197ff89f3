"""Whether a node accepts writes: shut by the first write-ahead log failure (fail-stop).

A write is applied only after its record is in the log, so a log that cannot
be written must stop every write of the node, not just the one that met the
failure: the tables share the data dir's disk, and a node that keeps applying
writes it cannot log would hand a restart a state no client was told about.
Every table's log checks the gate before it appends and shuts it with a
``LogFault`` (what failed, where, the errno) when a write, fsync, open or cut
fails. The gate stays shut until ``recstore.ps.checkpoint.failstop`` finds the log
working again; listeners (the server's health and metrics) hear every change.
"""

from __future__ import annotations

import errno as errno_names
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from recstore.core import WritesStopped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogFault:
    """One failure of a table's log: the condition a stopped node reports."""

    table: str
    operation: str  # write, fsync, open, cut
    path: str
    errno: int | None
    error: str  # the operating system's message
    since: float  # unix time

    @classmethod
    def of(cls, table: str, operation: str, path: str, error: BaseException) -> LogFault:
        number = error.errno if isinstance(error, OSError) else None
        message = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        return cls(table, operation, path, number, message or type(error).__name__, time.time())

    @property
    def errno_name(self) -> str:
        return errno_names.errorcode.get(self.errno, "") if self.errno is not None else ""

    def describe(self) -> str:
        code = f"[{self.errno_name or self.errno}] " if self.errno is not None else ""
        return f"{self.operation} of {self.path} (table {self.table!r}) failed: {code}{self.error}"


Listener = Callable[[], None]


class WriteGate:
    """Thread-safe: shut by ``trip``, opened again by ``reopen``; ``check`` refuses while shut."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._fault: LogFault | None = None
        self._needs_checkpoint = False
        self._listeners: list[Listener] = []
        self._faults: Counter[str] = Counter()

    @property
    def fault(self) -> LogFault | None:
        """The failure that stopped writes (the first one), None while writes are accepted."""
        return self._fault

    @property
    def needs_checkpoint(self) -> bool:
        """Memory and log disagree: resuming must checkpoint memory first."""
        return self._needs_checkpoint

    def fault_counts(self) -> dict[str, int]:
        """Faults seen since start, by operation (a metric)."""
        with self._cond:
            return dict(self._faults)

    def check(self) -> None:
        """Refuse a write (nothing applied) while the gate is shut."""
        fault = self._fault
        if fault is not None:
            raise WritesStopped(refusal(fault))

    def trip(self, fault: LogFault, *, diverged: bool = False) -> None:
        """Stop writes after ``fault``; ``diverged``: memory and log disagree (writes
        applied whose records were lost, or a record of a refused write not cut out)."""
        with self._cond:
            self._faults[fault.operation] += 1
            self._needs_checkpoint |= diverged
            first = self._fault is None
            if first:
                self._fault = fault
            self._cond.notify_all()
        if first:
            log.error(
                "write-ahead log failed: the node accepts no writes until it works again",
                extra={"table": fault.table, "operation": fault.operation, "path": fault.path,
                       "errno": fault.errno_name or fault.errno, "error": fault.error},
            )  # fmt: skip
            self._notify()
        else:
            log.warning("write-ahead log failed again: %s", fault.describe())

    def trips(self) -> int:
        """How many faults were seen so far (``reopen`` compares it)."""
        with self._cond:
            return sum(self._faults.values())

    def reopen(self, trips: int | None = None) -> bool:
        """Accept writes again (the logs work and memory is durable); False, changing
        nothing, when a fault came after ``trips`` (as ``trips()`` said) was read."""
        with self._cond:
            if trips is not None and sum(self._faults.values()) != trips:
                return False
            fault, self._fault = self._fault, None
            self._needs_checkpoint = False
            self._cond.notify_all()
        if fault is not None:
            log.info("write-ahead log works again: writes resumed", extra={"table": fault.table})
            self._notify()
        return True

    def wait(self, *, stopped: bool, timeout: float) -> bool:
        """Block until writes are stopped (or accepted); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: (self._fault is not None) == stopped, timeout)

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` (from the thread that changed it) on every stop and resume."""
        self._listeners.append(listener)

    def _notify(self) -> None:
        for listener in list(self._listeners):
            listener()


def refusal(fault: LogFault) -> str:
    """What a write refused while the gate is shut is told."""
    return (
        f"writes stopped: {fault.describe()}; nothing of this request was applied, "
        "and the node accepts writes again once its log can be written"
    )
