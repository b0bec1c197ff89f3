"""The ``recstore restore`` command: reshard offline from the old shards' checkpoints.

Run against the data dir of each new shard while its node is stopped; the node
then starts from the checkpoint the restore wrote (``recstore.ps.reshard.offline_restore``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def restore(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="The new shard's data dir.")],
    sources: Annotated[
        list[Path],
        typer.Option(
            "--from",
            help="Checkpoint dir of one old shard (e.g. <data-dir>/checkpoints/<id>); "
            "repeat for every old shard.",
        ),
    ],
    shard_index: Annotated[int, typer.Option("--shard-index", min=0)] = 0,
    num_shards: Annotated[int, typer.Option("--num-shards", min=1)] = 1,
    durability: Annotated[
        str, typer.Option(help="The durability the node will run with: checkpoint or wal.")
    ] = "checkpoint",
    restore_root: Annotated[
        Path | None,
        typer.Option(
            "--restore-root",
            help="Every --from must lie under this dir (default: the data dir's parent).",
        ),
    ] = None,
    keep_checkpoints: Annotated[int, typer.Option("--keep-checkpoints", min=1)] = 3,
    device: Annotated[str, typer.Option(help="cpu or cuda (cuda:N).")] = "cpu",
    mode: Annotated[
        str,
        typer.Option(
            help="saved: each table as it was saved; inference: open the tables for "
            "serving (the optimizer state is dropped); training: open them for training "
            "(the optimizer state starts afresh where none was saved)."
        ),
    ] = "saved",
) -> None:
    """Restore tables into a stopped node's data dir from checkpoints taken at another
    shard count; the node keeps only the rows of the slots it owns."""
    if durability not in ("checkpoint", "wal"):
        raise typer.BadParameter("must be checkpoint or wal", param_hint="--durability")
    if mode not in ("saved", "inference", "training"):
        raise typer.BadParameter("must be saved, inference or training", param_hint="--mode")
    if shard_index >= num_shards:
        raise typer.BadParameter(
            f"must be below --num-shards {num_shards}", param_hint="--shard-index"
        )

    from recstore.core import RecStoreError, TableMode
    from recstore.ps.reshard.offline_restore import restore_data_dir

    try:
        info = restore_data_dir(
            data_dir,
            sources,
            shard_index=shard_index,
            num_shards=num_shards,
            durability=durability,
            allowed_root=restore_root,
            keep=keep_checkpoints,
            device=device,
            mode=None if mode == "saved" else TableMode(mode),
        )
    except RecStoreError as error:
        typer.echo(f"restore refused: {error}", err=True)
        raise typer.Exit(2) from None
    summary = {"checkpoint": info.checkpoint_id, "path": str(info.path), "rows": info.rows}
    typer.echo(json.dumps(summary | {"tables": info.tables}))


def register(app: typer.Typer) -> None:
    app.command("restore")(restore)
