"""On-demand checkpoints of the local provisioner, on real nodes: every shard saves under
one id and the status reports it (completed with every shard's part, or failed with the
shard's reason); a second request while one runs is refused."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from recstore.admin.errors import ProvisioningError
from recstore.core import TableSpec
from recstore.local.provisioner import LocalProvisioner

from . import reporter_double

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SPEC = TableSpec(name="clicks", num_embeddings=100, embedding_dim=4, shards=2)


class Statuses(reporter_double.Statuses):
    """The reporter double, waiting on the one table these tests use."""

    def wait(self, what: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        return self.wait_for("clicks", what, check)

    def request_in(self, request_id: int, state: str) -> dict[str, Any]:
        def reached(status: dict[str, Any]) -> bool:
            asked = status.get("checkpointRequest") or {}
            return (asked.get("requestId"), asked.get("state")) == (request_id, state)

        return self.wait(f"checkpoint {request_id} {state}", reached)


@pytest.fixture
def provisioned(tmp_path: Path) -> Iterator[tuple[LocalProvisioner, Statuses, Path]]:
    statuses = Statuses()
    provisioner = LocalProvisioner(tmp_path / "state", statuses, poll_interval=0.1)
    provisioner.create_table(SPEC)
    statuses.wait("Ready", lambda status: status.get("phase") == "Ready")
    yield provisioner, statuses, tmp_path / "state" / "tables" / "clicks"
    provisioner.close()


def test_every_shard_saves_under_one_id_and_the_status_lists_them(
    provisioned: tuple[LocalProvisioner, Statuses, Path],
) -> None:
    provisioner, statuses, directory = provisioned
    provisioner.request_checkpoint("clicks", 7)
    status = statuses.request_in(7, "Completed")
    done = status["checkpointRequest"]
    assert done["id"] == "request-7" and done["message"] is None
    endpoints = provisioner.endpoints("clicks")
    assert [(s["index"], s["endpoint"], s["error"]) for s in done["shards"]] == [
        (0, endpoints[0], None), (1, endpoints[1], None)
    ]  # fmt: skip
    assert status["lastCheckpoint"] == done
    for shard in (0, 1):
        assert (directory / f"shard-{shard}" / "checkpoints" / "request-7").is_dir()


def test_a_shard_that_cannot_save_fails_the_checkpoint_with_its_reason(
    provisioned: tuple[LocalProvisioner, Statuses, Path],
) -> None:
    provisioner, statuses, directory = provisioned
    checkpoints = directory / "shard-1" / "checkpoints"
    shutil.rmtree(checkpoints, ignore_errors=True)
    checkpoints.write_text("not a directory")  # shard 1's node cannot write one
    provisioner.request_checkpoint("clicks", 7)
    status = statuses.request_in(7, "Failed")
    failed = status["checkpointRequest"]
    first, second = failed["shards"]
    assert first["error"] is None and second["error"] is not None
    assert failed["message"] == f"shard 1 ({second['endpoint']}): {second['error']}"
    assert status["lastCheckpoint"] is None  # no checkpoint of the whole table
    # finished: the next request is taken
    checkpoints.unlink()
    provisioner.request_checkpoint("clicks", 8)
    assert statuses.request_in(8, "Completed")["lastCheckpoint"]["id"] == "request-8"


def test_a_second_request_while_one_runs_is_refused(
    provisioned: tuple[LocalProvisioner, Statuses, Path],
) -> None:
    provisioner, statuses, _directory = provisioned
    held = provisioner.node_pid("clicks", 1)
    os.kill(held, signal.SIGSTOP)  # shard 1 saves once it runs again
    try:
        provisioner.request_checkpoint("clicks", 7)
        with pytest.raises(ProvisioningError) as refused:
            provisioner.request_checkpoint("clicks", 8)
        assert refused.value.status_code == 409
        assert str(refused.value) == (
            "checkpoint 7 of table 'clicks' is still running; request another once it has "
            "completed or failed"
        )
    finally:
        os.kill(held, signal.SIGCONT)
    statuses.request_in(7, "Completed")
    provisioner.request_checkpoint("clicks", 8)
    statuses.request_in(8, "Completed")
