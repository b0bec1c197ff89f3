"""A checkpoint that fails on a full disk gives its space back: every file it opened is closed.

A node whose data dir is a small tmpfs: a Save that runs out of room is refused
(UNAVAILABLE, ENOSPC), its temporary files are removed and none of them stays
open, so the free space is what it was before; the node then saves once there
is room again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest

from recstore.ps.serve.server import start_in_thread
from recstore.v1 import ps_pb2

from .conftest import Client, MountTmpfs, spec

ROWS, DIM = 16_000, 32  # 2 MiB of values: their checkpoint needs more than the dir has left


def open_deleted_files(under: Path) -> list[str]:
    """Files under ``under`` this process holds open although they are deleted."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(str(under)) and target.endswith(" (deleted)"):
            held.append(target)
    return held


@pytest.mark.parametrize(("durability", "size"), [("checkpoint", "2m"), ("wal", "4m")])
def test_a_save_that_fills_the_disk_gives_every_byte_back(
    tmp_path: Path, mounts: MountTmpfs, durability: str, size: str
) -> None:
    data_dir = tmp_path / "small"
    mounts(data_dir, f"size={size}")  # in WAL mode the log takes half
    handle = start_in_thread(data_dir=data_dir, durability=durability)
    try:
        client = Client(handle.address)
        client.create(spec(num_embeddings=ROWS, embedding_dim=DIM, initializer={"kind": "zeros"}))
        keys = np.arange(ROWS)
        client.push("emb", keys, np.ones((ROWS, DIM), np.float32))
        free_before = shutil.disk_usage(data_dir).free
        with pytest.raises(grpc.RpcError) as failed:
            client.save("too-big")
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "No space left on device" in failed.value.details()
        assert open_deleted_files(data_dir) == []
        assert shutil.disk_usage(data_dir).free == free_before
        assert not [p for p in (data_dir / "checkpoints").iterdir() if p.name != "too-big"]
        client.call("DropTable", ps_pb2.DropTableRequest(table="emb"))
        client.create(spec("small", num_embeddings=10, embedding_dim=DIM))
        assert client.save("fits").checkpoint_id == "fits"  # the space is there again
    finally:
        handle.stop(final_checkpoint=False)
