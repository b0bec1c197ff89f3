"""Updates held back to ride on the next pull: one round trip per node and training step.

The torch modules' backward (a collection's, or each bag's) hands its
gradients here instead of sending them, in order; the next module pull takes
them and gives each node its share inside that node's MultiPull, which
applies them before it pulls, so every read still sees every earlier write.
Sent on their own, the updates of step n and the pulls of step n+1 cost two
round trips per node, and the pull has to wait for the update's reply;
carried, one. Anything else that touches the tables sends them first
(``release``), and when no pull comes within ``max_delay`` a timer thread
sends them, so a trainer that stops pulling never leaves its gradients
unapplied for longer than that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

CARRY_ENV = "RECSTORE_UPDATE_CARRY_MS"
DEFAULT_MAX_DELAY = 0.02  # seconds: well above a step's gap, well below anything a person sees


class CarriedUpdates(Generic[T]):
    """Held updates and the lock that orders taking them against sending them.

    ``send`` (the backend's: send now, track as in flight) runs with ``lock``
    held, and so does the pull that takes them; whoever holds the lock owns the
    held updates, so they are sent exactly once.
    """

    def __init__(self, send: Callable[[list[T]], None], max_delay: float) -> None:
        if max_delay <= 0:
            raise ValueError(f"max_delay must be > 0 seconds, got {max_delay}")
        self.lock = threading.RLock()
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
