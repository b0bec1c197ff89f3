"""The local platform resharded offline, as docs/local.md tells: 2 shards -> 3 shards.

Checkpoint, declare the new count, stop, move the old shards aside, run
``recstore restore`` for each new shard, start again: every row is served.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from recstore import RecStoreClient
from recstore.cli import app
from recstore.ps.checkpoint import read as checkpoint_read

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROWS, DIM = 400, 4


def _pull_all(platform: object, role: str) -> torch.Tensor:
    client = RecStoreClient(role=role)
    client.set_admin_url(platform.url, platform.token, ps_token=platform.ps_token)  # type: ignore[attr-defined]
    client.init_data("emb", (ROWS, DIM), torch.float32)
    try:
        return client.pull("emb", torch.arange(ROWS))
    finally:
        client.close()


def test_local_table_reshards_offline(tmp_path: Path, helpers: SimpleNamespace) -> None:
    state = tmp_path / "state"
    first = helpers.start_platform(state, online_resharding=False)  # the offline path
    try:
        api = helpers.Api(first)
        api.create_table({"name": "emb", "numEmbeddings": ROWS, "embeddingDim": DIM, "shards": 2})
        api.wait_ready("emb")
        client = RecStoreClient(role="reshard-local")
        client.set_admin_url(first.url, first.token, ps_token=first.ps_token)
        client.init_data("emb", (ROWS, DIM), torch.float32)
        rows = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(3))
        client.push("emb", torch.arange(ROWS), rows)
        client.close()
        api.http.patch("/tables/emb", json={"shards": 3}).raise_for_status()
        api.http.close()
    finally:
        first.stop()  # final checkpoints

    aside = state / "resharding-emb"
    (state / "tables" / "emb").rename(aside)
    sources = []
    for shard in range(2):
        newest = checkpoint_read.list_checkpoints(aside / f"shard-{shard}" / "checkpoints")[-1]
        sources += ["--from", str(newest.path)]
    for shard in range(3):
        result = CliRunner().invoke(
            app,
            ["restore", "--data-dir", str(state / "tables" / "emb" / f"shard-{shard}"),
             "--shard-index", str(shard), "--num-shards", "3",
             "--restore-root", str(state), *sources],
        )  # fmt: skip
        assert result.exit_code == 0, result.output

    second = helpers.start_platform(state)
    try:
        api = helpers.Api(second)
        table = api.wait_ready("emb")
        assert [s["ready"] for s in table["status"]["shards"]] == [True, True, True]
        torch.testing.assert_close(_pull_all(second, "reshard-local-2"), rows)
        table = helpers.wait_for(
            lambda: (t := api.table("emb"))["status"].get("slotMapEpoch") == 2 and t,
            30, "the nodes' slot map reported",
        )  # fmt: skip
        conditions = {c["type"]: c["status"] for c in table["status"]["conditions"]}
        assert conditions["ReshardRequired"] == "False"
        api.http.close()
    finally:
        second.stop()
