"""``recstore token``: mint, list and revoke admin API tokens (needs an admin token).

Roles: viewer, editor, admin, and provisioner — the identity a provisioner
(the operator in a cluster) uses to register PS nodes and write shard status;
no other role may. The secret is printed once and cannot be shown again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table as RichTable

from recstore.cli.api_client import DEFAULT_ADMIN_URL, AdminClient, CliError
from recstore.cli.tables import AdminUrl, StateDir, Token, _client
from recstore.local.state_dir import DEFAULT_STATE_DIR

ROLES = ("viewer", "editor", "admin", "provisioner")
tokens = typer.Typer(help="Admin API tokens: create (shown once), list, revoke.")


def _run(
    admin_url: str, token: str | None, state_dir: Path, action: Callable[[AdminClient], None]
) -> None:
    client = _client(admin_url, token, state_dir)
    try:
        action(client)
    except CliError as error:
        typer.secho(f"error: {error}", err=True, fg="red")
        raise typer.Exit(1) from None
    finally:
        client.close()


@tokens.command("create")
def create(
    name: Annotated[str, typer.Argument(help="What the token is for (shown in the audit log).")],
    role: Annotated[str, typer.Option(help=f"One of {', '.join(ROLES)}.")] = "viewer",
    admin_url: AdminUrl = DEFAULT_ADMIN_URL,
    token: Token = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Create a token and print its secret (the only time it is shown)."""
    if role not in ROLES:
        typer.secho(f"error: --role must be one of {', '.join(ROLES)}, got {role!r}", err=True)
        raise typer.Exit(1)

    def action(client: AdminClient) -> None:
        created = client.request("POST", "/tokens", json={"name": name, "role": role}).json()
        typer.echo(created["token"])
        typer.secho(
            f"token {created['id']} ({role}) created; the secret above is not shown again",
            err=True,
        )

    _run(admin_url, token, state_dir, action)


@tokens.command("list")
def list_tokens(
    admin_url: AdminUrl = DEFAULT_ADMIN_URL,
    token: Token = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """List the active tokens (never their secrets)."""

    def action(client: AdminClient) -> None:
        view = RichTable("ID", "NAME", "ROLE", "PREFIX", "CREATED BY")
        for item in client.get("/tokens", params={"limit": 500})["items"]:
            view.add_row(
                str(item["id"]), item["name"], item["role"], item["prefix"], item["created_by"]
            )
        Console().print(view)

    _run(admin_url, token, state_dir, action)


@tokens.command("revoke")
def revoke(
    token_id: Annotated[int, typer.Argument(help="The token's id (see `recstore token list`).")],
    admin_url: AdminUrl = DEFAULT_ADMIN_URL,
    token: Token = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Revoke a token: it stops working at once, dashboard sessions included."""

    def action(client: AdminClient) -> None:
        client.request("DELETE", f"/tokens/{token_id}")
        typer.echo(f"token {token_id} revoked")

    _run(admin_url, token, state_dir, action)


def register(app: typer.Typer) -> None:
    app.add_typer(tokens, name="token")
