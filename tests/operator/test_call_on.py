"""``call_on``: a resharder thread's call on kopf's loop; its failure is the thread's, not
the loop's.

kopf, when it stops, re-raises the error of any task of its loop. A resharder's call
that fails because the operator is stopping (its API client closed by the
cleanup handler) must reach the resharder's thread only, or the operator's own exit
fails with it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from recstore.operator.reshard_store import call_on

pytestmark = pytest.mark.timeout(60)

Loop = tuple[asyncio.AbstractEventLoop, list["asyncio.Task[Any]"]]


@pytest.fixture
def kopf_loop() -> Iterator[Loop]:
    """An event loop running in a thread of its own, as kopf's does; every task it made."""
    loop = asyncio.new_event_loop()
    tasks: list[asyncio.Task[Any]] = []

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        tasks.append(task)
        return task

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop, tasks
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_the_result_comes_back(kopf_loop: Loop) -> None:
    async def answer() -> int:
        return 42

    assert call_on(kopf_loop[0], answer()) == 42


def test_a_failure_is_raised_in_the_caller_and_leaves_no_failed_task(kopf_loop: Loop) -> None:
    loop, tasks = kopf_loop

    async def closed_client() -> None:
        raise RuntimeError("Cannot send a request, as the client has been closed.")

    with pytest.raises(RuntimeError, match="client has been closed"):
        call_on(loop, closed_client())
    assert tasks
    assert all(t.done() and not t.cancelled() and t.exception() is None for t in tasks)


def test_a_call_cancelled_by_the_stopping_loop_is_an_error_in_the_caller(kopf_loop: Loop) -> None:
    loop, tasks = kopf_loop
    started = threading.Event()
    errors: list[BaseException] = []

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    def resharder() -> None:
        try:
            call_on(loop, forever())
        except BaseException as error:  # what the resharder's thread sees
            errors.append(error)

    caller = threading.Thread(target=resharder)
    caller.start()
    assert started.wait(10)
    loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])
    caller.join(10)
    assert [type(e) for e in errors] == [RuntimeError]
    assert "stopped" in str(errors[0])
    assert all(t.done() and t.exception() is None for t in tasks)


def test_a_closed_loop_refuses_at_once() -> None:
    loop = asyncio.new_event_loop()
    loop.close()

    async def never() -> None:
        raise AssertionError("not run")

    with pytest.raises(RuntimeError, match="event loop is closed"):
        call_on(loop, never())
