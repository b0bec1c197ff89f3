"""A step's updates on their way to the nodes: held to ride on a pull, or in flight.

Held (``HeldUpdates``): the torch modules' backward hands its gradients over
instead of sending them; the next module pull takes them and gives each node
its share inside that node's MultiPull, which applies them before it pulls,
so every read still sees every earlier write. Sent on their own, the updates
of step n and the pulls of step n+1 cost two round trips per node; carried,
one. Anything else that touches the tables sends them first (``release``),
and when no pull comes within ``max_delay`` a timer thread sends them.

In flight (``UpdatesInFlight``): sent without waiting, read-your-writes kept.
A table has at most one update in flight (a second one, or any pull, push or
drop of that table, first waits for it, so a table sees its updates in order
and every read sees every earlier write); at most ``max_in_flight`` updates
are in flight in all (one more first waits for the oldest); ``settle_all``
(``flush``, ``close``, ``delete_data``) waits for every one. An update that
failed is reported once, as the error of the next call on its table (or of
``settle_all``), with a note saying so.

Both share the lock of the step that owns them (``recstore.client.remote.step``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")

CARRY_ENV = "RECSTORE_UPDATE_CARRY_MS"
DEFAULT_MAX_DELAY = 0.02  # seconds: well above a step's gap, well below anything a person sees
MAX_IN_FLIGHT_ENV = "RECSTORE_MAX_PENDING_UPDATES"
DEFAULT_MAX_IN_FLIGHT = 16
FAILED_NOTE = "raised by an update sent in the background by an earlier call (e.g. backward)"


class HeldUpdates(Generic[T]):
    """Updates held back to ride on the next pull, and the timer that sends them otherwise.

    ``send`` (the step's: send now, track as in flight) runs with ``lock``
    held, and so does the pull that takes them; whoever holds the lock owns the
    held updates, so they are sent exactly once.
    """

    def __init__(
        self, send: Callable[[list[T]], None], max_delay: float, lock: threading.RLock
    ) -> None:
        if max_delay <= 0:
            raise ValueError(f"max_delay must be > 0 seconds, got {max_delay}")
        self.lock = lock
        self.max_delay = max_delay
        self._send = send
        self._held: list[T] = []
        self._since = 0.0
        self._wake = threading.Condition(self.lock)
        self._timer: threading.Thread | None = None
        self._idle = False  # the timer waits for something to be held (else it times out)
        self._closed = False

    def __len__(self) -> int:
        with self.lock:
            return len(self._held)

    def hold(self, updates: Sequence[T]) -> None:
        """Keep ``updates`` for the next pull, after any held before (they go in order)."""
        with self.lock:
            if self._closed:
                self._send(list(updates))
                return
            if not self._held:
                self._since = time.monotonic()  # the delay counts from the oldest held
            self._held.extend(updates)
            if self._timer is None:
                self._timer = threading.Thread(target=self._run, name="recstore-carry", daemon=True)
                self._timer.start()
            if self._idle:  # a timer counting down wakes by itself: no thread switch per step
                self._wake.notify()

    def take(self) -> list[T]:
        """The held updates, now the caller's to send (call with ``lock`` held)."""
        held, self._held = self._held, []
        return held

    def release(self) -> None:
        """Send the held updates now."""
        with self.lock:
            if self._held:
                self._send(self.take())

    def close(self) -> None:
        """Send what is held and stop the timer."""
        with self.lock:
            self._closed = True
            self._wake.notify()
            timer = self._timer
        if timer is not None:
            timer.join()
        self.release()

    def _run(self) -> None:
        with self.lock:
            while not self._closed:
                if not self._held:
                    self._idle = True
                    self._wake.wait()
                    self._idle = False
                    continue
                remaining = self._since + self.max_delay - time.monotonic()
                if remaining > 0:
                    self._wake.wait(remaining)
                    continue
                self._send(self.take())  # failures are the in-flight tracker's to report


class Completion(Protocol):
    def wait(self) -> object: ...


class UpdatesInFlight:
    """Updates sent and not yet collected, per table; failures kept until reported.

    Its bookkeeping runs under ``lock`` (the step's); waiting for a completion
    does not, unless the caller holds it.
    """

    def __init__(self, lock: threading.RLock, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._lock = lock
        self._in_flight: OrderedDict[str, Completion] = OrderedDict()  # oldest first
        self._failures: dict[str, BaseException] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def add(self, table: str, update: Completion) -> None:
        """Track ``update`` (already sent) of ``table``; waits for the oldest beyond the bound.

        The caller has settled ``table`` first, so it has no other update in flight.
        """
        with self._lock:
            self._in_flight[table] = update
            excess = len(self._in_flight) - self.max_in_flight
            oldest = list(self._in_flight.items())[:excess] if excess > 0 else []
        for name, completion in oldest:
            self._finish(name, completion)

    def settle(self, table: str) -> None:
        """Wait for ``table``'s update in flight; raise a failure of it not yet reported."""
        self.settle_tables((table,))

    def settle_tables(self, tables: Iterable[str]) -> None:
        """Wait for the update in flight of each of ``tables``; raise their first failure.

        Every one is waited for and every failure among them counts as reported
        by this call, so one refused step leaves nothing of its tables behind.
        """
        tables = list(dict.fromkeys(tables))
        with self._lock:
            waiting = [(name, self._in_flight[name]) for name in tables if name in self._in_flight]
        for name, completion in waiting:
            self._finish(name, completion)
        with self._lock:
            failures = [self._failures.pop(name) for name in tables if name in self._failures]
        _raise_first(failures)

    def settle_all(self) -> None:
        """Wait for every update in flight; raise the first failure not yet reported."""
        self.wait_all()
        with self._lock:
            failures, self._failures = list(self._failures.values()), {}
        _raise_first(failures)

    def wait_all(self) -> None:
        """Wait for every update in flight; failures stay recorded for their tables."""
        with self._lock:
            waiting = list(self._in_flight.items())
        for name, completion in waiting:
            self._finish(name, completion)

    def discard(self, table: str) -> None:
        """Forget a failure of ``table`` (dropped: its updates no longer matter)."""
        with self._lock:
            self._failures.pop(table, None)

    def _finish(self, table: str, completion: Completion) -> None:
        try:
            completion.wait()
        except Exception as error:
            with self._lock:
                if table not in self._failures:
                    if FAILED_NOTE not in getattr(error, "__notes__", ()):  # shared by tables
                        error.add_note(FAILED_NOTE)
                    self._failures[table] = error
        finally:
            with self._lock:
                if self._in_flight.get(table) is completion:
                    del self._in_flight[table]


def _raise_first(failures: list[BaseException]) -> None:
    """Raise the first of ``failures`` (one error shared by several tables counts once)."""
    failures = list({id(f): f for f in failures}.values())  # a multi update: one error
    if failures:
        first = failures[0]
        if len(failures) > 1:
            first.add_note(f"{len(failures) - 1} more background update(s) failed as well")
        raise first
