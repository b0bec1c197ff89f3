"""A local provisioner whose nodes require a token moves a table online with that token.

The shard a move starts and the move's runner call the nodes like the rest of
the provisioner does: with the nodes' auth token, else the new shard never
gets the table and the move never begins.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recstore.core import TableSpec
from recstore.core.control import ControlClient
from recstore.local.provisioner import LocalProvisioner
from recstore.v1 import ps_pb2

from .reporter_double import Statuses
from .test_read_only_tokens import ADMIN, _call, _token_file

pytestmark = pytest.mark.slow
ROWS = 100


def _moved(statuses: Statuses, shards: int) -> bool:
    status = statuses.latest.get("moved", {})
    done = {c["type"]: c for c in status.get("conditions", [])}.get("Resharding")
    ready = [s for s in status.get("shards", []) if s.get("ready")]
    return done is not None and done["reason"] == "MoveDone" and len(ready) == shards


def test_a_table_on_nodes_with_a_token_moves_to_a_new_shard(tmp_path: Path) -> None:
    statuses = Statuses()
    provisioner = LocalProvisioner(
        tmp_path / "state", statuses, auth_token_file=_token_file(tmp_path / "token", ADMIN),
        poll_interval=0.1, reshard_batch_slots=4096,
    )  # fmt: skip
    try:
        spec = TableSpec.model_validate({"name": "moved", "num_embeddings": ROWS,
                                         "embedding_dim": 4, "shards": 1})  # fmt: skip
        provisioner.create_table(spec)
        (shard,) = statuses.wait_ready("moved")["shards"]
        keys = np.arange(ROWS, dtype="<i8").tobytes()
        values = np.ones((ROWS, 4), "<f4").tobytes()
        push = ps_pb2.PushRequest(table="moved", keys=keys, values=values)
        assert _call(shard["endpoint"], ADMIN, "Push", push).name == "OK"
        provisioner.update_table(spec.model_copy(update={"shards": 2}), previous=spec)
        with statuses.changed:
            moved = statuses.changed.wait_for(lambda: _moved(statuses, 2), timeout=180)
        assert moved, f"the move to 2 shards did not finish: {statuses.latest.get('moved')}"
        rows = []
        for endpoint in provisioner.endpoints("moved"):
            with ControlClient(endpoint, token=ADMIN, timeout=30) as control:
                rows.append(int(control.stats("moved").size))
        assert sum(rows) == ROWS and min(rows) > 0, rows  # each row held once, both hold some
    finally:
        provisioner.close()
