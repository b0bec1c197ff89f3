"""Threads for background copying, at a lower CPU priority than training and write pauses.

A reshard copies a table's rows (snapshot pages, catch-up rounds)
while trainers keep using the table; on a busy machine that copy competes with
them for the CPU. The threads that only copy lower their own scheduling
priority (Linux: a per-thread nice value), so a trainer's requests and a
batch's write pause run first and the copy takes the cycles left over.
Raising a thread's priority again needs privileges, so background work runs
on threads of its own and never on the threads that serve the write pause.
Work that holds a table's lock for long stays at the normal priority: a
starved holder would stall the trainers waiting for that lock.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

#: nice value of background copy threads (0 normal .. 19 lowest). Measured on a busy
#: 2-core machine (bench/reshard_bench.py), 19 starved the copy (a move at 0.3x the
#: checkpoint rate) where 10 keeps it near 0.5x. It cannot keep the trainers' share on
#: its own: the copy's socket work runs in gRPC's threads and the kernel at the normal
#: priority (0, 10 and SCHED_IDLE measured alike), so the share is kept by capping the
#: copy's rate (recstore.core.reshard.pace).
BACKGROUND_NICE = 10


def lower_this_thread(nice: int = BACKGROUND_NICE) -> None:
    """Give the calling thread a nice value of at least ``nice``.

    Elsewhere than Linux (no per-thread nice), or where not permitted, it stays as it was.
    """
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, thread) < nice:
            os.setpriority(os.PRIO_PROCESS, thread, nice)
    except OSError:
        pass


def background_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads run at ``BACKGROUND_NICE``."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=lower_this_thread)
