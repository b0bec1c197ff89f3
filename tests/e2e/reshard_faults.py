"""Shared parts of the kill -9 tests of online moves on the local platform.

A trainer updates by unique integer deltas through SGD with lr 1 on a zeros
table, so every row must end as minus the exact sum of its acknowledged deltas;
it can be paused between steps, so a test can take the whole platform down
with no update in flight. The table, the steps and ``stop_at`` (the step hook
both the in-process and the subprocess platforms use: it runs the provisioner's
own step callback, then the fault for that step of that batch) are
``reshard_steps``'s, which the subprocess platform imports without torch.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from recstore import RecStoreClient
from recstore.core.control import ControlClient, Rpc
from recstore.v1 import ps_pb2

from .reshard_steps import BATCH_SLOTS, DIM, NAME, ROWS, SPEC, STEPS, stop_at

__all__ = ["BATCH_SLOTS", "NAME", "ROWS", "SPEC", "STEPS", "Trainer", "node_rows", "stop_at"]


class Trainer:
    """Updates random rows until stopped; ``pause`` waits until no update is in flight."""

    def __init__(self, url: str, token: str, ps_token: str, role: str) -> None:
        self.client = RecStoreClient(role=role)
        self.client.set_admin_url(url, token, ps_token=ps_token)
        self.client.init_data(NAME, (ROWS, DIM), torch.float32)
        self.sums = np.zeros(ROWS, dtype=np.int64)
        self.steps = 0
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._stopping = self._held = self._parked = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _next(self) -> bool:
        """Whether to run another update (parked while held)."""
        with self._cond:
            while self._held and not self._stopping:
                self._parked = True
                self._cond.notify_all()
                self._cond.wait()
            self._parked = False
            return not self._stopping

    def _loop(self) -> None:
        rng = np.random.default_rng(11)
        try:
            while self._next():
                ids = rng.choice(ROWS, 64, replace=False)
                delta = self.steps + 1  # unique per update
                grads = torch.full((64, DIM), float(delta))
                self.client.update(NAME, torch.from_numpy(ids), grads)
                self.sums[ids] += delta  # acknowledged
                self.steps += 1
        except BaseException as error:  # the test reports it
            self.error = error
        finally:
            with self._cond:
                self._parked = True
                self._cond.notify_all()

    def hold(self) -> None:
        """No new update after the one in flight (returns at once)."""
        with self._cond:
            self._held = True

    def pause(self) -> None:
        """Hold, and wait until the update in flight is through."""
        with self._cond:
            self._held = True
            assert self._cond.wait_for(lambda: self._parked, 300), "the update did not finish"
        assert self.error is None, self.error

    def resume(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def finish(self) -> None:
        """Stop, then check every row against the sum of its acknowledged deltas."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.thread.join(timeout=120)
        assert self.error is None, self.error
        assert self.steps > 0
        got = self.client.pull(NAME, torch.arange(ROWS)).numpy()
        want = -self.sums[:, None].astype(np.float32).repeat(DIM, 1)
        wrong = np.flatnonzero((got != want).any(axis=1))
        assert not len(wrong), (
            f"{len(wrong)} rows differ from their acknowledged updates, e.g. row "
            f"{wrong[0]}: {got[wrong[0], 0]} != {want[wrong[0], 0]}"
        )
        self.client.close()


def node_rows(endpoints: list[str], ps_token: str) -> list[int]:
    """Rows each node holds: after a pull of every row they add up to ROWS exactly when
    no node kept a copy of rows it moved out (or imported and dropped)."""
    counts = []
    for endpoint in endpoints:
        with ControlClient(endpoint, token=ps_token, timeout=60) as control:
            request = ps_pb2.GetTableStatsRequest(table=NAME)
            stats: Any = control.call(Rpc("GetTableStats", request, lambda r: r))
            counts.append(int(stats.size))
    return counts
