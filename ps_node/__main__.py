"""``python -m recstore.ps``: the ``recstore ps-node`` command on its own."""

from __future__ import annotations

import typer

from recstore.cli.ps_node import ps_node

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(ps_node)

if __name__ == "__main__":
    app()
