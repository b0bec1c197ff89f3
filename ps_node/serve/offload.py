"""Where a blocking node call runs: inline on the event loop, or on the thread pool.

Handing a call to a pool thread costs a queue hand-off, a loop wake-up and GIL
ping-pong between the two threads: tens of microseconds, more than the engine
needs for a small batch. A small batch therefore runs inline on the event loop
when no other call is in the pool (so no engine or table lock can be held by
one of ours and the loop never waits on one); everything else goes to the pool.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

#: batches up to this many rows may run inline (the engine needs well under 1 ms)
INLINE_MAX_ROWS = 2048
#: the same bound in values (rows x dim) for multi-table calls, whose tables have
#: various dims: INLINE_MAX_ROWS rows of the dim 64 it was measured at
INLINE_MAX_VALUES = INLINE_MAX_ROWS * 64


class Offload:
    def __init__(
        self,
        executor: Executor,
        inline_max_rows: int = INLINE_MAX_ROWS,
        inline_max_values: int = INLINE_MAX_VALUES,
    ) -> None:
        self.executor = executor
        self.inline_max_rows = inline_max_rows
        self.inline_max_values = inline_max_values
        self.in_flight = 0  # calls now in the pool; only touched on the event loop
        self.inline_calls = 0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the pool."""
        loop = asyncio.get_running_loop()
        self.in_flight += 1
        try:
            return await loop.run_in_executor(self.executor, functools.partial(fn, *args))
        finally:
            self.in_flight -= 1

    async def run_batch(self, rows: int, fn: Callable[..., T], *args: Any) -> T:
        """Run a data-path call of ``rows`` rows inline when small and the pool is idle."""
        if rows <= self.inline_max_rows and self.in_flight == 0:
            self.inline_calls += 1
            return fn(*args)
        return await self.run(fn, *args)

    async def run_multi(self, values: int, fn: Callable[..., T], *args: Any) -> T:
        """Run a multi-table call moving ``values`` values (rows x dim) inline when small."""
        return await self.run_batch(
            self.inline_max_rows if values <= self.inline_max_values else values, fn, *args
        )
