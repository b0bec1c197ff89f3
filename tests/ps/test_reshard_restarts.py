"""A source restarted while its slots are sealed holds them sealed until the batch is decided.

The batch may be committed elsewhere while the source is down; a source that came
back serving the slots as its own would acknowledge writes the new owner never
sees (lost at the cleanup). The seal is on disk, so the restarted source holds
those requests until the resumed move commits (they are refused and go to the
new owner) or aborts (they are applied on the source, still authoritative).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from recstore.core.reshard.plan import Phase, ReshardJob
from recstore.ps.serve.server import start_in_thread

from .test_reshard_online import Crash, Fleet, Trainer, _rows_left, _stats


@pytest.mark.parametrize("step", ["verify", "activate"])  # aborted, finished
def test_a_source_restarted_while_sealed_stays_sealed_until_the_batch_is_decided(
    tmp_path: Path, step: str
) -> None:
    fleet = Fleet(tmp_path, 3, 2)
    try:
        trainer = Trainer(fleet.endpoints, fleet.spec.name)
        rng = np.random.default_rng(5)
        for _ in range(5):
            trainer.step(rng)

        def crash(at: str, job: ReshardJob) -> None:
            if at == step and job.current == 0:
                raise Crash(at)  # the provisioner dies with the source sealed

        job = ReshardJob.start(fleet.spec.name, fleet.store.slot_map(), 3, batch_slots=2000)
        with pytest.raises(Crash):
            fleet.run(3, on_step=crash).run(job)
        source = job.batch.source
        handle = fleet.handles[source]
        handle.stop()  # its reshard state in memory is gone with it
        fleet.handles[source] = start_in_thread(
            port=handle.port, data_dir=tmp_path / f"node-{source}", shard_index=source,
            num_shards=2,
        )  # fmt: skip
        assert _stats(fleet, source).migration.sealed  # not serving the slots it may have given

        # writes while the batch is undecided wait on the seal, then reach the owner
        writer = threading.Thread(target=lambda: [trainer.step(rng) for _ in range(5)])
        writer.start()
        stored = fleet.store.job()
        assert stored is not None
        done = fleet.run(3).resume(stored)
        writer.join(timeout=120)
        assert not writer.is_alive()
        assert done.phase == Phase.done
        for shard in (0, 1):
            assert _rows_left(fleet, shard, done) == 0
            assert not _stats(fleet, shard).HasField("migration")
        trainer.check()
    finally:
        fleet.stop()
