"""Prefetch runs in the background, bounds what is in flight, and hands each result over once."""

from __future__ import annotations

import threading

import pytest
import torch

from recstore.client.prefetch import PrefetchExecutor


@pytest.fixture
def executor():
    prefetcher = PrefetchExecutor(workers=2, max_in_flight=2)
    yield prefetcher
    prefetcher.shutdown()


def test_submit_returns_before_the_pull_finishes(executor) -> None:
    release = threading.Event()

    def slow_pull() -> torch.Tensor:
        assert release.wait(5)
        return torch.ones(3, 2)

    prefetch_id = executor.submit(slow_pull)
    assert not executor.done(prefetch_id)  # the caller is free to compute meanwhile
    release.set()
    assert torch.equal(executor.wait(prefetch_id, timeout=5), torch.ones(3, 2))


def test_in_flight_is_bounded(executor) -> None:
    release = threading.Event()
    executor.submit(lambda: (release.wait(5), torch.zeros(1))[1])
    executor.submit(lambda: (release.wait(5), torch.zeros(1))[1])
    third_submitted = threading.Event()

    def submit_third() -> None:
        executor.submit(lambda: torch.zeros(1))
        third_submitted.set()

    thread = threading.Thread(target=submit_third)
    thread.start()
    assert not third_submitted.wait(0.2)  # blocked: two pulls already in flight
    assert executor.in_flight() == 2
    release.set()
    assert third_submitted.wait(5)
    thread.join(5)


def test_errors_are_raised_by_wait_and_the_id_is_spent(executor) -> None:
    def failing() -> torch.Tensor:
        raise RuntimeError("table gone")

    prefetch_id = executor.submit(failing)
    with pytest.raises(RuntimeError, match="table gone"):
        executor.wait(prefetch_id, timeout=5)
    with pytest.raises(ValueError, match="unknown prefetch id"):
        executor.wait(prefetch_id)


def test_wait_timeout_keeps_the_id(executor) -> None:
    release = threading.Event()
    prefetch_id = executor.submit(lambda: (release.wait(5), torch.ones(1))[1])
    with pytest.raises(TimeoutError):
        executor.wait(prefetch_id, timeout=0.05)
    release.set()
    assert executor.wait(prefetch_id, timeout=5).item() == 1.0


@pytest.mark.parametrize("prefetch_id", [0, 12345, -1])
def test_unknown_ids(executor, prefetch_id) -> None:
    with pytest.raises(ValueError):
        executor.done(prefetch_id)
