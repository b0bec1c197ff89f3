"""The table and the step hook of the kill -9 tests of online moves, without the trainer.

Kept apart from ``reshard_faults`` (the trainer, which needs torch and the SDK)
because ``platform_until_step.py`` imports this in every `recstore up` the
provisioner-kill test starts: torch alone took about as long to import there
as the whole platform, at every restart.
"""

from __future__ import annotations

from collections.abc import Callable

from recstore.core.reshard.plan import ReshardJob
from recstore.core.reshard.protocol import ReshardRun

ROWS, DIM = 2000, 4
NAME = "killed"
SPEC = {
    "name": NAME,
    "numEmbeddings": ROWS,
    "embeddingDim": DIM,
    "shards": 2,
    "initializer": {"kind": "zeros"},
    "optimizer": {"kind": "sgd", "lr": 1.0},
    "checkpoint": {"durability": "wal"},  # acknowledged writes survive kill -9
}
#: the steps of a batch, in the order the runner reaches them
STEPS = ["begin", "snapshot", "catch-up", "seal", "tail", "verify", "commit", "activate", "cleanup"]
#: 2 -> 3 moves 5461 slots: in this many per batch, one batch per step and then some
BATCH_SLOTS = 600

Fault = Callable[[str, ReshardJob], None]


def stop_at(fault: Fault) -> Callable[..., None]:
    """A ``ReshardRun._step`` that runs the provisioner's callback, then ``fault``."""
    original = ReshardRun._step

    def step(self: ReshardRun, name: str, job: ReshardJob) -> None:
        original(self, name, job)
        fault(name, job)

    return step
