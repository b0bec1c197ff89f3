"""The cap on a move's copy rate: the wait it computes, the pace it keeps, what it refuses."""

from __future__ import annotations

import math

import pytest

from recstore.core.reshard.pace import RATE_ENV, CopyPace, check_rate, rate_from, wait_s


@pytest.mark.parametrize(
    ("started", "now", "copied", "rate", "wait"),
    [
        (0.0, 0.0, 1000, 0.0, 0.0),  # no cap: never waits
        (0.0, 0.0, 1000, 1000.0, 1.0),  # a second's worth copied at once
        (0.0, 0.4, 1000, 1000.0, 0.6),
        (0.0, 2.0, 1000, 1000.0, 0.0),  # behind the rate: no wait, and no credit kept
        (10.0, 10.5, 3000, 2000.0, 1.0),
    ],
)
def test_the_wait_keeps_the_bytes_copied_within_the_rate(
    started: float, now: float, copied: int, rate: float, wait: float
) -> None:
    assert wait_s(started, now, copied, rate) == pytest.approx(wait)


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_paced_copy_takes_its_bytes_over_the_rate() -> None:
    clock = FakeTime()
    pace = CopyPace(1_000_000, clock=lambda: clock.now, sleep=clock.sleep)
    for _ in range(4):  # pages of 0.5 MB, each copied in 0.1 s
        clock.now += 0.1
        pace.count(500_000)
    assert clock.slept == pytest.approx([0.4, 0.4, 0.4, 0.4])  # 0.5 s a page in all
    assert clock.now - 100.0 == pytest.approx(2.0)  # 2 MB at 1 MB/s


def test_an_uncapped_copy_never_waits() -> None:
    clock = FakeTime()
    pace = CopyPace(0, clock=lambda: clock.now, sleep=clock.sleep)
    for _ in range(3):
        pace.count(10**9)
    assert clock.slept == []


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "fast", "1e400"])
def test_a_rate_that_is_not_finite_bytes_per_second_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=RATE_ENV):
        rate_from(raw)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_a_pace_refuses_a_wrong_rate(value: float) -> None:
    with pytest.raises(ValueError, match="copy rate"):
        CopyPace(value)
    with pytest.raises(ValueError, match="bytes per second"):
        check_rate(value)


@pytest.mark.parametrize(("raw", "rate"), [(None, 0.0), ("", 0.0), ("0", 0.0), ("3e7", 3e7)])
def test_the_rate_is_read_as_bytes_per_second(raw: str | None, rate: float) -> None:
    assert rate_from(raw) == rate
