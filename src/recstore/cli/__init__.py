"""The `recstore` command: one typer app, each service adding its own command.

Service modules import their heavy dependencies inside their command functions,
so `recstore --help` and the client-side commands stay fast and lean.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="recstore",
    help="RecStore: embedding storage for recommendation-model training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# Each module defines register(app) and imports its service only when run.
_COMMAND_MODULES = (
    "platform", "tables", "tokens", "ps_node", "restore", "recover", "admin", "operator",
)  # fmt: skip

for _module_name in _COMMAND_MODULES:
    _module = importlib.import_module(f"recstore.cli.{_module_name}")
    _module.register(app)


def main() -> None:
    app()
