"""`recstore up` whose move stops at one step, for a test to kill -9 it there.

``python platform_until_step.py STATE_DIR PORT BATCH STEP``: the local platform
on ``PORT``; ``STATE_DIR/up`` appears once the admin API serves. The move's
runner finishes or aborts the batch an earlier run left, then waits before
beginning batch ``BATCH`` until a line arrives on stdin: the test first lets
the trainer's update in flight at the last kill through, which a seal of this
batch, frozen below, would otherwise hold for good. When the runner reaches
``STEP`` of batch ``BATCH`` it writes ``STATE_DIR/stopped-at`` (the event the
test waits on) and blocks there, as if the process froze at that point, until
it is killed.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from reshard_steps import BATCH_SLOTS, stop_at  # this file's folder is on sys.path

from recstore.core.reshard.plan import ReshardJob
from recstore.core.reshard.protocol import ReshardRun
from recstore.local.platform import LocalPlatform


def main() -> None:
    state, port, batch, step = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    forever, ahead = threading.Event(), threading.Event()

    def block(name: str, job: ReshardJob) -> None:
        if name == "begin" and job.current == batch and not ahead.is_set():
            sys.stdin.readline()  # the test's go-ahead (or end of file: it is gone)
            ahead.set()  # once: a retried batch begins again without asking
        if name == step and job.current == batch:
            (state / "stopped-at").write_text(f"{batch} {name}")
            forever.wait()

    ReshardRun._step = stop_at(block)  # type: ignore[method-assign]
    platform = LocalPlatform(state, port=port, poll_interval=0.1, reshard_batch_slots=BATCH_SLOTS)
    platform.start()
    (state / "up").write_text(platform.url)
    forever.wait()


if __name__ == "__main__":
    main()
