"""Asynchronous prefetch: pulls that run in the background while the caller computes.

``prefetch`` hands a pull to a small pool of worker threads and returns an id
at once; the torch work and the network or native calls of a pull release the
GIL, so the caller's own compute overlaps them. At most ``max_in_flight``
pulls run or wait at a time: a caller that prefetches faster than the backend
serves blocks in ``submit`` instead of queueing without bound. Finished results
are kept until ``wait`` collects them (each id once).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch

DEFAULT_MAX_IN_FLIGHT = 8


class PrefetchExecutor:
    def __init__(self, *, workers: int = 2, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if workers < 1 or max_in_flight < 1:
            raise ValueError("workers and max_in_flight must be >= 1")
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="recstore-prefetch")
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._futures: dict[int, Future[torch.Tensor]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.max_in_flight = max_in_flight

    def submit(self, pull: Callable[[], torch.Tensor]) -> int:
        """Start ``pull`` in the background; blocks while ``max_in_flight`` pulls are pending."""
        self._slots.acquire()
        try:
            future = self._pool.submit(pull)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        with self._lock:
            prefetch_id = next(self._ids)
            self._futures[prefetch_id] = future
        return prefetch_id

    def done(self, prefetch_id: int) -> bool:
        return self._future(prefetch_id).done()

    def wait(self, prefetch_id: int, timeout: float | None = None) -> torch.Tensor:
        """The pulled rows; re-raises the pull's error. The id is forgotten afterwards."""
        future = self._future(prefetch_id)
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            raise TimeoutError(f"prefetch {prefetch_id} not done after {timeout}s") from None
        finally:
            if future.done():  # a timed-out wait leaves the id collectable
                with self._lock:
                    self._futures.pop(prefetch_id, None)

    def in_flight(self) -> int:
        with self._lock:
            return sum(not f.done() for f in self._futures.values())

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._futures.clear()

    def _future(self, prefetch_id: int) -> Future[torch.Tensor]:
        with self._lock:
            future = self._futures.get(prefetch_id)
        if future is None:
            raise ValueError(
                f"unknown prefetch id {prefetch_id} (never issued or already collected)"
            )
        return future
