"""The ``recstore ps-node`` command: run one PS node until SIGTERM."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recstore.cli.tls_options import CertOption, ClientCaOption, KeyOption, server_tls
from recstore.core.limits import DEFAULT_MAX_BATCH_BYTES, MAX_MESSAGE_BYTES, MESSAGE_OVERHEAD_BYTES


def ps_node(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Checkpoints, catalogue, WAL.")],
    port: Annotated[int, typer.Option(help="gRPC port (0: any free port).")] = 50051,
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0: every address of the machine).")
    ] = "127.0.0.1",
    shard_index: Annotated[int, typer.Option("--shard-index", min=0)] = 0,
    num_shards: Annotated[int, typer.Option("--num-shards", min=1)] = 1,
    device: Annotated[str, typer.Option(help="cpu or cuda (cuda:N).")] = "cpu",
    auth_token_file: Annotated[
        Path | None, typer.Option("--auth-token-file", help="File holding the bearer token.")
    ] = None,
    read_only_token_file: Annotated[
        Path | None,
        typer.Option(
            "--read-only-token-file",
            help="File holding a second bearer token that may only read (Pull, List, Stats).",
        ),
    ] = None,
    durability: Annotated[
        str, typer.Option(help="checkpoint (lose writes since the last one on a crash) or wal.")
    ] = "checkpoint",
    checkpoint_interval: Annotated[
        float, typer.Option("--checkpoint-interval", help="Seconds between checkpoints; 0: off.")
    ] = 0.0,
    keep_checkpoints: Annotated[int, typer.Option("--keep-checkpoints", min=1)] = 3,
    wal_probe_interval: Annotated[
        float,
        typer.Option(
            "--wal-probe-interval",
            min=0.001,
            help="Seconds between attempts to resume writes after the write-ahead log failed.",
        ),
    ] = 5.0,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Prometheus /metrics port.")
    ] = None,
    malloc_tuning: Annotated[
        bool, typer.Option(help="Tune glibc malloc for large messages.")
    ] = True,
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
    table_spec_file: Annotated[
        list[Path] | None,
        typer.Option(
            "--table-spec-file",
            help="JSON/YAML TableSpec (wire form) or list of them, created at start if "
            "missing; a hosted table with another spec stops the node (exit 2). Repeatable.",
        ),
    ] = None,
    max_batch_bytes: Annotated[
        int,
        typer.Option(
            "--max-batch-bytes",
            min=1,
            max=MAX_MESSAGE_BYTES - MESSAGE_OVERHEAD_BYTES,
            help="Payload bytes (keys, values, gradients) one request or reply may carry; "
            "larger requests and replies are refused with RESOURCE_EXHAUSTED before they are "
            "read or built. The gRPC message limit is this plus 1 MiB.",
        ),
    ] = DEFAULT_MAX_BATCH_BYTES,
    parent_pid: Annotated[
        int | None,
        typer.Option(
            "--parent-pid",
            min=1,
            help="Stop (with a final checkpoint) when this process exits, however it exits.",
        ),
    ] = None,
    tls_cert: CertOption = None,
    tls_key: KeyOption = None,
    tls_client_ca: ClientCaOption = None,
) -> None:
    """Run a PS node: one shard of any number of embedding tables over gRPC."""
    if durability not in ("checkpoint", "wal"):
        raise typer.BadParameter("must be checkpoint or wal", param_hint="--durability")
    if not device.startswith(("cpu", "cuda")):
        raise typer.BadParameter("must be cpu or cuda[:N]", param_hint="--device")
    if shard_index >= num_shards:
        raise typer.BadParameter(
            f"must be below --num-shards {num_shards}", param_hint="--shard-index"
        )
    if read_only_token_file is not None and auth_token_file is None:
        raise typer.BadParameter(
            "needs --auth-token-file (without it every caller may write)",
            param_hint="--read-only-token-file",
        )

    from recstore.core import malloc_tuning as tuning
    from recstore.ps.serve import logs
    from recstore.ps.serve.auth import read_token_file
    from recstore.ps.serve.config import NodeConfig
    from recstore.ps.serve.process import run
    from recstore.ps.serve.table_specs import load_spec_file

    tls = server_tls(tls_cert, tls_key, tls_client_ca)
    declared = []
    for path in table_spec_file or []:
        try:
            declared.extend(load_spec_file(path))
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--table-spec-file") from None
    logs.configure(log_level.upper())
    if malloc_tuning:
        tuning.apply()
    config = NodeConfig(
        data_dir=data_dir,
        host=host,
        port=port,
        shard_index=shard_index,
        num_shards=num_shards,
        device=device,
        auth_token=read_token_file(auth_token_file) if auth_token_file else None,
        read_only_token=read_token_file(read_only_token_file) if read_only_token_file else None,
        durability=durability,
        checkpoint_interval=checkpoint_interval,
        keep_checkpoints=keep_checkpoints,
        metrics_port=metrics_port,
        table_specs=declared,
        parent_pid=parent_pid,
        max_batch_bytes=max_batch_bytes,
        wal_probe_interval=wal_probe_interval,
        tls=tls,
    )
    raise typer.Exit(run(config))


def register(app: typer.Typer) -> None:
    app.command("ps-node")(ps_node)
