"""Small batches run inline on the event loop only while the thread pool is idle."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from recstore.ps.serve.offload import Offload


async def test_small_batches_inline_large_ones_on_the_pool() -> None:
    loop_thread = threading.get_ident()
    with ThreadPoolExecutor(2) as pool:
        offload = Offload(pool, inline_max_rows=100)
        assert await offload.run_batch(100, threading.get_ident) == loop_thread
        assert await offload.run_batch(101, threading.get_ident) != loop_thread
        assert offload.inline_calls == 1 and offload.in_flight == 0


async def test_no_inline_call_while_the_pool_is_busy() -> None:
    loop_thread = threading.get_ident()
    release = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        offload = Offload(pool, inline_max_rows=100)
        slow = asyncio.create_task(offload.run(release.wait, 60))
        while offload.in_flight == 0:
            await asyncio.sleep(0)
        # a writer on the pool may hold an engine or table lock: do not block the loop on it
        assert await offload.run_batch(1, threading.get_ident) != loop_thread
        release.set()
        assert await slow is True
        assert offload.in_flight == 0 and offload.inline_calls == 0


async def test_multi_table_calls_are_bounded_by_values_not_rows() -> None:
    loop_thread = threading.get_ident()
    with ThreadPoolExecutor(2) as pool:
        offload = Offload(pool, inline_max_rows=100, inline_max_values=6400)
        assert await offload.run_multi(6400, threading.get_ident) == loop_thread  # 400 rows x 16
        assert await offload.run_multi(6401, threading.get_ident) != loop_thread
        assert offload.inline_calls == 1 and offload.in_flight == 0
