"""`recstore up` (the whole platform on this machine) and `recstore bench`."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from recstore.core.reshard.pace import RATE_ENV, check_rate
from recstore.local.state_dir import (
    ADMIN_TOKEN_FILE,
    DEFAULT_STATE_DIR,
    PS_READ_ONLY_TOKEN_FILE,
    PS_TOKEN_FILE,
    InsecureStateDir,
)

BENCHES = {
    "store": "bench/store_bench.py",
    "ps": "bench/ps_bench.py",
    "train": "bench/train_bench.py",
    "soak": "bench/soak.py",
}


def _copy_rate(value: float) -> float:
    try:
        return check_rate(value, "--reshard-copy-rate")
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def up(
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="Catalogue, tokens, node data.")
    ] = DEFAULT_STATE_DIR,
    host: Annotated[str, typer.Option(help="Address of the admin API and dashboard.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Admin API / dashboard port (0: any).")] = 8080,
    device: Annotated[str, typer.Option(help="cpu or cuda for the PS nodes.")] = "cpu",
    log_level: Annotated[str, typer.Option("--log-level")] = "WARNING",
    tls: Annotated[
        bool,
        typer.Option(
            "--tls/--no-tls",
            help="Serve the admin API and the PS nodes over TLS, from a CA kept in the "
            "state dir (clients: RECSTORE_TLS_CA=<state dir>/tls/ca.pem).",
        ),
    ] = False,
    online_resharding: Annotated[
        bool,
        typer.Option(
            "--online-resharding/--no-online-resharding",
            help="A new shard count moves slots while the table serves (off: it is only "
            "flagged ReshardRequired, for the offline path with `recstore restore`).",
        ),
    ] = True,
    reshard_copy_rate: Annotated[
        float,
        typer.Option(
            envvar=RATE_ENV,
            callback=_copy_rate,
            help="Bytes per second a move's copy may take before each seal (0: no cap); "
            "lower leaves more of a shared machine to the trainers.",
        ),
    ] = 0.0,
) -> None:
    """Run the platform here: admin API on SQLite, PS nodes on loopback. Ctrl-C stops it."""
    import logging

    from rich.console import Console

    from recstore.local.platform import LocalPlatform

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    with console.status("starting the admin API and the local provisioner ..."):
        try:
            platform = LocalPlatform(
                state_dir, host=host, port=port, device=device, tls=tls,
                online_resharding=online_resharding, reshard_copy_rate=reshard_copy_rate,
            )  # fmt: skip
        except InsecureStateDir as error:
            typer.secho(f"error: {error}", err=True, fg="red")
            raise typer.Exit(1) from None
        platform.start()
    tables = platform.provisioner.table_names()
    console.print(f"[bold green]RecStore is up[/] — dashboard {platform.url}/")
    console.print(f"  admin API   {platform.url}/api/v1  (OpenAPI: {platform.url}/docs)")
    state = platform.state_dir
    console.print(f"  token file  {state / ADMIN_TOKEN_FILE}  (the admin API's: RECSTORE_TOKEN)")
    console.print(f"  PS token    {state / PS_TOKEN_FILE}  (the nodes': RECSTORE_PS_TOKEN)")
    console.print(f"  read-only   {state / PS_READ_ONLY_TOKEN_FILE}  (inference tables' readers)")
    if platform.tls is not None:
        console.print(f"  TLS CA      {platform.tls.client.ca}  (export RECSTORE_TLS_CA=...)")
    console.print(f"  tables      {', '.join(tables) if tables else 'none yet'}")
    console.print("  apply a table: recstore apply -f examples/tables/dense-cpu.yaml")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    with console.status("stopping: final checkpoints ..."):
        platform.stop()
    console.print("RecStore stopped")


def bench(
    which: Annotated[str, typer.Argument(help="store | ps | train | soak")],
    args: Annotated[list[str] | None, typer.Argument(help="Passed to the benchmark.")] = None,
) -> None:
    """Run a benchmark from bench/ (prints a table, writes JSON under bench/results/)."""
    script = BENCHES.get(which)
    if script is None:
        typer.secho(f"error: unknown benchmark {which!r}; one of {sorted(BENCHES)}", err=True)
        raise typer.Exit(1)
    path = Path(script)
    if not path.exists():
        typer.secho(f"error: {script} not found: run from the repository root", err=True)
        raise typer.Exit(1)
    raise typer.Exit(subprocess.call([sys.executable, str(path), *(args or [])]))


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(bench)
