"""HeldUpdates: held until taken, released, or the delay runs out; sent exactly once."""

from __future__ import annotations

import threading

import pytest

from recstore.client.remote.updates import HeldUpdates


class Sends:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.event = threading.Event()

    def __call__(self, updates: list[str]) -> None:
        self.batches.append(updates)
        self.event.set()


def test_held_updates_are_taken_by_the_next_pull_and_never_sent() -> None:
    sends = Sends()
    carried = HeldUpdates(sends, max_delay=3600, lock=threading.RLock())
    carried.hold(["a", "b"])
    assert len(carried) == 2
    with carried.lock:
        assert carried.take() == ["a", "b"]
    carried.release()  # nothing left to send
    carried.close()
    assert sends.batches == []


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("hold again", []),  # both held, in order
        ("release", [["a"]]),
        ("close", [["a"]]),
    ],
)
def test_anything_but_a_pull_sends_what_is_held(action: str, expected: list[list[str]]) -> None:
    sends = Sends()
    carried = HeldUpdates(sends, max_delay=3600, lock=threading.RLock())
    carried.hold(["a"])
    if action == "hold again":
        carried.hold(["b"])
        assert len(carried) == 2
        with carried.lock:
            assert carried.take() == ["a", "b"]
    elif action == "release":
        carried.release()
    else:
        carried.close()
        carried.hold(["c"])  # once closed, nothing is held: sent at once
        expected = [*expected, ["c"]]
    assert sends.batches == expected
    carried.close()


def test_the_timer_sends_updates_no_pull_took() -> None:
    sends = Sends()
    carried = HeldUpdates(sends, max_delay=0.001, lock=threading.RLock())
    carried.hold(["a"])
    assert sends.event.wait(timeout=30)
    assert sends.batches == [["a"]] and len(carried) == 0
    carried.close()
    assert sends.batches == [["a"]]  # sent once


def test_a_delay_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_delay"):
        HeldUpdates(Sends(), max_delay=0, lock=threading.RLock())
