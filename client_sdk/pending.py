"""Updates in flight: gradients sent without waiting, with read-your-writes kept.

A backward pass sends each table's update and goes on; the trainer's next
forward overlaps it. The rules that keep results exactly those of waiting
every time: a table has at most one update in flight (a second one, or any
pull, push or drop of that table, first waits for it, so a table sees its
updates in order and every read sees every earlier write); at most
``max_in_flight`` updates are in flight in all (one more first waits for the
oldest); ``settle_all`` (``flush``, ``close``, ``delete_data``) waits for
every one. An update that failed is reported once, as the ``RuntimeError``
of the next call on its table (or of ``settle_all``), with a note saying so.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

DEFAULT_MAX_IN_FLIGHT = 16
FAILED_NOTE = "raised by an update sent in the background by an earlier call (e.g. backward)"


class Completion(Protocol):
    def wait(self) -> object: ...


class PendingUpdates:
    def __init__(self, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._lock = threading.Lock()
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
