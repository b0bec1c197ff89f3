"""The ``recstore recover`` command: bring back a table its nodes refuse, as an operator's act.

A node refuses a table whose saved data it found damaged at start (a damaged
write-ahead log; every checkpoint damaged) rather than serve less than was
acknowledged. ``recstore recover <table>`` asks each of the table's nodes to
recover it again (its files repaired meanwhile); with ``--accept-log-loss`` a
node serves what its log holds intact up to the damage instead, cuts the rest
out of the log (copies stay in its data dir) and says exactly what it dropped.
The nodes are the table's own, found through the admin API, which records the
act and what each node reported in its audit log (``table.recover``); or those
given with ``--endpoint`` (nodes outside a platform: no audit log to write, the
nodes log it). The report is printed as JSON, before it goes to the audit log;
a node that did not recover the table (it still refuses it, or cannot be
reached) ends the command with status 1.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from recstore.cli.api_client import (
    DEFAULT_ADMIN_URL,
    AdminClient,
    CliError,
    resolve_ps_token,
    resolve_tls,
    resolve_token,
)
from recstore.core.tls import ClientTls
from recstore.local.state_dir import DEFAULT_STATE_DIR

RECOVERED, FAILED = "recovered", "failed"


def recover(
    table: Annotated[str, typer.Argument(help="Table name.")],
    accept_log_loss: Annotated[
        bool,
        typer.Option(
            "--accept-log-loss",
            help="Serve what the write-ahead log holds intact up to the damage, dropping "
            "every write after it (reported exactly; copies kept in the node's data dir).",
        ),
    ] = False,
    endpoints: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint",
            help="A node (host:port) to ask instead of the table's nodes from the admin API; "
            "repeat for several.",
        ),
    ] = None,
    ps_token: Annotated[
        str | None,
        typer.Option(
            "--ps-token",
            help="The nodes' write token (default: $RECSTORE_PS_TOKEN, else the ps-token "
            "file `recstore up` keeps in --state-dir).",
        ),
    ] = None,
    admin_url: Annotated[
        str, typer.Option("--admin-url", envvar="RECSTORE_ADMIN_URL", help="Admin API base URL.")
    ] = DEFAULT_ADMIN_URL,
    token: Annotated[
        str | None, typer.Option("--token", help="Admin API token (default: $RECSTORE_TOKEN).")
    ] = None,
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="Where `recstore up` keeps its tokens.")
    ] = DEFAULT_STATE_DIR,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each node.")] = 600.0,
) -> None:
    """Recover a table its nodes refuse: again, or accepting the loss of its log's tail."""
    admin: AdminClient | None = None
    try:
        tls = resolve_tls(admin_url, state_dir)
        if not endpoints:  # the table's own nodes; the act goes to the audit log
            admin = AdminClient(admin_url, resolve_token(token, state_dir), tls=tls)
            endpoints = list(admin.get(f"/tables/{table}/discovery")["endpoints"])
        ps_token = resolve_ps_token(ps_token, state_dir)
        report = _ask_nodes(table, accept_log_loss, endpoints, ps_token, tls, timeout)
        typer.echo(json.dumps(report, indent=1))  # said before anything else can fail
        if admin is not None:
            admin.request("POST", f"/tables/{table}/recoveries", json=report)
    except CliError as error:
        typer.secho(f"error: {error}", err=True, fg="red")
        raise typer.Exit(1) from None
    finally:
        if admin is not None:
            admin.close()
    failed = [s for s in report["shards"] if s["outcome"] == FAILED]
    if failed:
        typer.secho(
            f"error: {len(failed)} node(s) did not recover {table!r}: "
            + "; ".join(f"{s['endpoint']}: {s['error']}" for s in failed),
            err=True, fg="red",
        )  # fmt: skip
        raise typer.Exit(1)


def _ask_nodes(
    table: str,
    accept_log_loss: bool,
    endpoints: list[str],
    ps_token: str | None,
    tls: ClientTls | None,
    timeout: float,
) -> dict[str, Any]:
    """RecoverTable on every node, in shard order: what each recovered, or why not."""
    from recstore.core.control import ControlClient, ControlError, recover_table_rpc

    shards: list[dict[str, Any]] = []
    for shard, endpoint in enumerate(endpoints):
        outcome: dict[str, Any] = {"shard": shard, "endpoint": endpoint}
        try:
            with ControlClient(endpoint, token=ps_token, timeout=timeout, tls=tls) as node:
                recovered = node.call(recover_table_rpc(table, accept_log_loss=accept_log_loss))
        except ControlError as error:
            outcome |= {"outcome": FAILED, "error": f"{error.code}: {error.details}"}
        else:
            outcome |= {"outcome": RECOVERED, **dataclasses.asdict(recovered)}
            outcome["writes_dropped"] = recovered.writes_dropped
        shards.append(outcome)
    return {"table": table, "accept_log_loss": accept_log_loss, "shards": shards}


def register(app: typer.Typer) -> None:
    app.command("recover")(recover)
